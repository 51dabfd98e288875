# shellcheck shell=bash
# Setup for pstack-store's tests and benchmarks (sourced by scripts/test; uses apt_need).
#
# pstack-store runs its whole integration suite against SQLite *and* a real PostgreSQL.
# This installs Debian's `postgresql`, starts the installed cluster, and creates the role
# and database behind the tests' default URL:
#
#     postgres://pstack:pstack@127.0.0.1:5432/pstack_test
#
# (override with PSTACK_TEST_PG_URL). Idempotent: re-running changes nothing.
# With CI=true the store tests fail (never skip) when that URL is unreachable.

apt_need postgresql

_pg_setup() {
    local ver
    # pg_lsclusters columns: Ver Cluster Port Status Owner Data Log.
    ver=$(pg_lsclusters --no-header 2>/dev/null | awk '$2 == "main" { print $1; exit }')
    if [ -z "$ver" ]; then
        ver=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1)
        [ -n "$ver" ] || { echo "20-postgres: no PostgreSQL version installed" >&2; return 1; }
        pg_createcluster "$ver" main
    fi
    if ! pg_lsclusters --no-header | awk -v v="$ver" '$1 == v && $2 == "main"' | grep -q online; then
        pg_ctlcluster "$ver" main start
    fi
    local i
    for i in $(seq 1 30); do
        su postgres -c "psql -qAtc 'SELECT 1'" >/dev/null 2>&1 && break
        sleep 1
    done
    su postgres -c "psql -qAtc \"SELECT 1 FROM pg_roles WHERE rolname = 'pstack'\"" | grep -q 1 ||
        su postgres -c "psql -qc \"CREATE ROLE pstack LOGIN PASSWORD 'pstack' CREATEDB\""
    local db
    for db in pstack_test pstack_bench; do
        su postgres -c "psql -qAtc \"SELECT 1 FROM pg_database WHERE datname = '$db'\"" | grep -q 1 ||
            su postgres -c "psql -qc \"CREATE DATABASE $db OWNER pstack\""
    done
}
_pg_setup
unset -f _pg_setup
