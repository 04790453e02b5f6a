#!/bin/sh
# First start on an empty PGDATA: a cluster whose superuser is POSTGRES_USER with POSTGRES_PASSWORD
# (read from a file, never a command line), password logins over TCP, and the database POSTGRES_DB.
# Later starts use the cluster as it is. Then the command (postgres) replaces this shell.
set -eu

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}"
    user="${POSTGRES_USER:-postgres}"
    database="${POSTGRES_DB:-$user}"
    umask 077
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo 'host all all all scram-sha-256' >> "$PGDATA/pg_hba.conf"
    if [ "$database" != postgres ]; then
        # A server on the socket only, for createdb; the health check sees it ready only once the real one runs.
        pg_ctl -D "$PGDATA" -o "-c listen_addresses= -c unix_socket_directories=$PGDATA" -w start >/dev/null
        createdb --host="$PGDATA" --username="$user" -- "$database"
        pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    fi
    echo "postgres-entrypoint: cluster made in $PGDATA (superuser $user, database $database)"
fi

exec "$@"
