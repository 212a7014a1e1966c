# The services' runtime: the Debian base with what the binaries link to at
# run time and the user they run as. Cached as an image of its own, so that
# the services' image (services.Dockerfile) is only a copy on top of it.
FROM entrega-base:trixie
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 entrega
