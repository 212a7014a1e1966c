#!/bin/bash
# The official postgres image's entrypoint, in the part entrega uses.
set -euo pipefail
if [[ ${1:-} == -* ]]; then
    set -- postgres "$@"
fi
if [[ ${1:-} != postgres ]]; then
    exec "$@"
fi
as_postgres() { runuser -u postgres -- "$@"; }
if [[ ! -s $PGDATA/PG_VERSION ]]; then
    auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
    if [[ -z ${POSTGRES_PASSWORD:-} && $auth != trust ]]; then
        echo "error: set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust" >&2
        exit 1
    fi
    as_postgres initdb -D "$PGDATA" -U postgres --auth-local=trust --auth-host="$auth" \
        --encoding=UTF8 --locale=C.UTF-8
    echo "host all all all $auth" >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    # Initialised on the Unix socket only, as the official image does.
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
    if [[ -n ${POSTGRES_PASSWORD:-} ]]; then
        # From standard input: psql expands :'password' there, not in -c.
        echo "alter user postgres password :'password'" |
            as_postgres psql -v ON_ERROR_STOP=1 -q -v password="$POSTGRES_PASSWORD"
    fi
    for script in /docker-entrypoint-initdb.d/*.sql; do
        [[ -f $script ]] && as_postgres psql -v ON_ERROR_STOP=1 -q -f "$script"
    done
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop
    echo "PostgreSQL init process complete; ready for start up."
fi
exec runuser -u postgres -- "$@"
