# shellcheck shell=bash
# Setup for pstack-store's tests and benchmarks (sourced by scripts/test; uses apt_need).
#
# pstack-store runs its whole integration suite against SQLite *and* a real PostgreSQL.
# This installs Debian's `postgresql`, starts the installed cluster, and creates the role
# and databases behind the tests' and benchmarks' default URLs:
#
#     postgres://pstack:pstack@127.0.0.1:5432/pstack_test    (PSTACK_TEST_PG_URL overrides)
#     postgres://pstack:pstack@127.0.0.1:5432/pstack_bench   (PSTACK_BENCH_PG_URL overrides)
#
# Idempotent: re-running changes nothing. With CI=true the store tests fail (never skip)
# when the test URL is unreachable. Written for `set -euo pipefail`: no pipeline here
# ends early, and every check captures its output before testing it.

apt_need postgresql

_pg_psql() {
    su postgres -c "psql -qAtc \"$1\""
}

_pg_setup() {
    local ver status found i db
    # pg_lsclusters columns: Ver Cluster Port Status Owner Data Log.
    ver=$(pg_lsclusters --no-header 2>/dev/null | awk '$2 == "main" { print $1 }' | sort -V | tail -n1)
    if [ -z "$ver" ]; then
        ver=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n1)
        if [ -z "$ver" ]; then
            echo "20-postgres: no PostgreSQL server installed under /usr/lib/postgresql" >&2
            return 1
        fi
        pg_createcluster "$ver" main
    fi
    status=$(pg_lsclusters --no-header | awk -v v="$ver" '$1 == v && $2 == "main" { print $4 }')
    if [ "$status" != "online" ]; then
        pg_ctlcluster "$ver" main start
    fi
    for i in $(seq 1 30); do
        if _pg_psql "SELECT 1" >/dev/null 2>&1; then
            break
        fi
        sleep 1
    done
    found=$(_pg_psql "SELECT 1 FROM pg_roles WHERE rolname = 'pstack'")
    if [ "$found" != "1" ]; then
        _pg_psql "CREATE ROLE pstack LOGIN PASSWORD 'pstack'"
    fi
    for db in pstack_test pstack_bench; do
        found=$(_pg_psql "SELECT 1 FROM pg_database WHERE datname = '$db'")
        if [ "$found" != "1" ]; then
            _pg_psql "CREATE DATABASE $db OWNER pstack"
        fi
    done
    echo "20-postgres: PostgreSQL $ver/main online; postgres://pstack:pstack@127.0.0.1:5432/pstack_test ready"
}
_pg_setup
unset -f _pg_setup _pg_psql
