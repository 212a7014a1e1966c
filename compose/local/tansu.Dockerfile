# The local stand-in for apache/kafka: tansu (the scripts' cached build),
# storing its log in a PostgreSQL inside the same container.
FROM entrega-postgres:17
COPY tansu /usr/local/bin/tansu
COPY schema.sql /usr/local/share/tansu/schema.sql
COPY tansu-entrypoint.sh /usr/local/bin/tansu-entrypoint.sh
ENTRYPOINT ["tansu-entrypoint.sh"]
STOPSIGNAL SIGTERM
EXPOSE 9092
CMD []
