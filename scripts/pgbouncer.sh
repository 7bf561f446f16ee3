#!/usr/bin/env bash
# Two PgBouncers in front of the PostgreSQL server on 127.0.0.1:5432, for the store suite run
# through a pooler (scripts/test.sh; docs/decisions/0033-behind-a-pooler-and-a-failover.md):
#
#   127.0.0.1:6432  pool_mode = transaction   (a server connection is lent for one transaction)
#   127.0.0.1:6433  pool_mode = session       (a server connection is lent for the whole session)
#
# Both forward every database name to the server as the client gave it (`* =`), so the tests'
# fresh databases need no configuration, and trust the client as the server does (the local
# `postgres` user, no password). Debian's package (`pgbouncer`, 1.18 on Debian 12) is installed
# when missing. Idempotent: a PgBouncer already answering on a port is left as it is.
#
#   scripts/pgbouncer.sh          start both (installing the package when missing)
#   scripts/pgbouncer.sh stop     stop the ones this script started
#
# Then, for example:
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres CAPGATE_REQUIRE_POSTGRES=1 \
#   CAPGATE_TEST_POOLER_URL='postgres://postgres@127.0.0.1:6432/postgres?pooler=transaction' \
#   cargo nextest run -E 'binary(store) and test(/postgres/)'
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Not the repository: PgBouncer runs as `postgres` (it refuses root), which must write here.
dir=${CAPGATE_PGBOUNCER_DIR:-/tmp/capgate-pgbouncer}

die() {
    printf 'scripts/pgbouncer.sh: %s\n' "$*" >&2
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        die "\`$*\` needs root, and sudo is not available without a password"
    fi
}

# PgBouncer refuses to run as root: as root, it is started as `postgres`.
as_bouncer() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

answers() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

if [ "${1:-}" = stop ]; then
    for port in 6432 6433; do
        if [ -f "$dir/$port.pid" ]; then
            kill "$(cat "$dir/$port.pid")" 2>/dev/null || true
        fi
    done
    exit 0
fi

if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
    printf '\n==> apt-get install pgbouncer\n' >&2
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pgbouncer
fi
pgbouncer=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)

mkdir -p "$dir"
if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$dir"
fi
# PgBouncer's `trust` still looks the user up in its auth_file.
printf '"postgres" ""\n' >"$dir/userlist.txt"

for mode in transaction:6432 session:6433; do
    pool_mode=${mode%%:*}
    port=${mode##*:}
    if answers "$port"; then
        continue
    fi
    # Pools as large as a test needs: two stores of 8 connections and a listener each. In session
    # mode a client holds its server connection for as long as it is open, so a smaller pool would
    # make the test's own connections wait for each other.
    cat >"$dir/$port.ini" <<EOF
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = $pool_mode
default_pool_size = 40
max_client_conn = 2000
logfile = $dir/$port.log
pidfile = $dir/$port.pid
EOF
    as_bouncer "$pgbouncer" -d "$dir/$port.ini"
    for _ in $(seq 1 50); do
        answers "$port" && break
        sleep 0.1
    done
    answers "$port" || die "PgBouncer ($pool_mode) did not start on 127.0.0.1:$port (see $dir/$port.log)"
done
