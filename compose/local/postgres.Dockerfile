# PostgreSQL 17 from Debian's packages: the local stand-in for the official
# postgres:17 image, which cannot be pulled here. Same interface: the
# entrypoint initialises $PGDATA (POSTGRES_PASSWORD, POSTGRES_HOST_AUTH_METHOD,
# /docker-entrypoint-initdb.d/*.sql) and runs `postgres` with the arguments.
FROM entrega-base:trixie
# No cluster at install: the entrypoint makes the one in $PGDATA.
RUN mkdir -p /etc/postgresql-common \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-17 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /docker-entrypoint-initdb.d /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/17/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["docker-entrypoint.sh"]
STOPSIGNAL SIGINT
EXPOSE 5432
CMD ["postgres"]
