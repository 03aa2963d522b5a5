#!/usr/bin/env bash
# Installs and starts Debian's PostgreSQL, and creates the role and database the
# store's PostgreSQL tests use:
#   TESSERA_PG_URL=postgres://tessera:tessera@127.0.0.1:5432/tessera_test
# Idempotent: safe to run again on a machine where it already ran.
set -euo pipefail

if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
fi

version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$version main"; then
    pg_createcluster "$version" main
fi
if ! pg_lsclusters -h | awk '$1=="'"$version"'" && $2=="main" {print $4}' | grep -qx online; then
    pg_ctlcluster "$version" main start
fi

# Wait until the server accepts connections.
for _ in $(seq 1 30); do
    if su postgres -c "psql -qAtc 'SELECT 1'" >/dev/null 2>&1; then break; fi
    sleep 1
done

su postgres -c "psql -v ON_ERROR_STOP=1 -qAt" <<'SQL'
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tessera') THEN
        CREATE ROLE tessera LOGIN PASSWORD 'tessera';
    END IF;
END
$$;
SQL
if ! su postgres -c "psql -qAtc \"SELECT 1 FROM pg_database WHERE datname = 'tessera_test'\"" | grep -qx 1; then
    su postgres -c "createdb -O tessera tessera_test"
fi

echo "PostgreSQL $version ready: TESSERA_PG_URL=postgres://tessera:tessera@127.0.0.1:5432/tessera_test"
