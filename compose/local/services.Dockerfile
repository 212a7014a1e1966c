# The services' image without the rust: image: the three binaries, built on
# the host (Debian 12, glibc 2.36), on the Debian runtime image. The build
# context is a folder holding only them (scripts/docker images).
FROM entrega-runtime:trixie
COPY order-service outbox-relay inventory-service /usr/local/bin/
USER entrega
# Each service binds 127.0.0.1 by default; in a container it must listen on
# all interfaces, which compose sets with *_HTTP_ADDR=0.0.0.0:PORT.
CMD ["order-service"]
