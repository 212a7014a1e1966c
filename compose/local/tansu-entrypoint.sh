#!/bin/bash
# tansu with its storage PostgreSQL, both in this container. Settings:
#   TANSU_LISTENER_URL            default tcp://0.0.0.0:9092
#   TANSU_ADVERTISED_LISTENER_URL default tcp://kafka:9092
#   TANSU_STORAGE_PORT            the storage server's port on 127.0.0.1,
#                                 default 5432 (another with host networking)
set -euo pipefail
listener="${TANSU_LISTENER_URL:-tcp://0.0.0.0:9092}"
advertised="${TANSU_ADVERTISED_LISTENER_URL:-tcp://kafka:9092}"
port="${TANSU_STORAGE_PORT:-5432}"
data=/var/lib/tansu/postgres
as_postgres() { runuser -u postgres -- "$@"; }
mkdir -p /var/lib/tansu && chown postgres:postgres /var/lib/tansu
fresh=false
if [[ ! -s $data/PG_VERSION ]]; then
    as_postgres initdb -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    fresh=true
fi
as_postgres pg_ctl -D "$data" -l /var/lib/tansu/postgres.log -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=/tmp -c fsync=off" start
if $fresh; then
    as_postgres psql -h 127.0.0.1 -p "$port" -q -c "create database tansu"
    as_postgres psql -h 127.0.0.1 -p "$port" -q -v ON_ERROR_STOP=1 -d tansu -f /usr/local/share/tansu/schema.sql
fi
stop() {
    kill -TERM "$broker" 2>/dev/null || true
    wait "$broker" || true
    as_postgres pg_ctl -D "$data" -m fast -w stop
    exit 0
}
trap stop TERM INT
tansu broker --cluster-id entrega --listener-url "$listener" \
    --advertised-listener-url "$advertised" \
    --storage-engine "postgres://postgres@127.0.0.1:$port/tansu" &
broker=$!
echo "tansu started: $advertised"
wait "$broker"
