#!/usr/bin/env bash
# Starts a local PostgreSQL for the River integration test and prints its
# connection URL on stdout, as the one line this script writes there:
#
#	export LLMRETRY_PG_URL="$(.ci/postgres.sh)"
#
# Everything else goes to stderr, so the URL can be captured. (Run it, do
# not source it: it sets -euo pipefail for itself.)
#
# Idempotent: it installs PostgreSQL with apt only when it is missing,
# creates the cluster only when there is none, starts it only when it is
# down, and creates the role and database only when they do not exist
# (the role's password is set every time, so a rerun repairs it). It runs
# as root, as CI does, and acts as the postgres user through runuser.
#
# Settings, from the environment, with their defaults:
#	PG_VERSION   the newest version under /usr/lib/postgresql, 15 on this machine
#	PG_CLUSTER   main
#	PG_USER      llmretry (also the password and the database's name)
set -euo pipefail

log() { echo "postgres.sh: $*" >&2; }

pg_user=${PG_USER:-llmretry}
pg_cluster=${PG_CLUSTER:-main}

# Install the server when this machine lacks it.
if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
	log "installing postgresql with apt"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update >&2
	apt-get install -y postgresql >&2
fi

if [ -z "${PG_VERSION:-}" ]; then
	PG_VERSION=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
fi

# Create the cluster when there is none. apt creates one on install, but a
# container image may have had it removed.
if ! pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$pg_cluster" '$1 == v && $2 == c { found = 1 } END { exit !found }'; then
	log "creating cluster $PG_VERSION/$pg_cluster"
	pg_createcluster "$PG_VERSION" "$pg_cluster" >&2
fi

# Start it unless it is already online: pg_ctlcluster fails on a running
# cluster, and a rerun must not.
status=$(pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$pg_cluster" '$1 == v && $2 == c { print $4 }')
if [ "$status" != "online" ]; then
	log "starting cluster $PG_VERSION/$pg_cluster"
	pg_ctlcluster "$PG_VERSION" "$pg_cluster" start >&2
fi
port=$(pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$pg_cluster" '$1 == v && $2 == c { print $3 }')

# pg_ctlcluster returns once the server is up, but wait for it to accept
# TCP connections anyway, for at most 30 s.
for _ in $(seq 1 60); do
	if pg_isready -q -h 127.0.0.1 -p "$port"; then
		break
	fi
	sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$port" >&2

# The role and the database, as the postgres superuser over the Unix
# socket (peer authentication). The test itself connects over TCP to
# 127.0.0.1 with a password, which Debian's pg_hba.conf allows
# (scram-sha-256), so it needs no socket access and no superuser.
as_postgres() { runuser -u postgres -- "$@"; }
as_postgres psql -q -p "$port" -v ON_ERROR_STOP=1 -v user="$pg_user" >&2 <<'SQL'
SELECT format('CREATE ROLE %I LOGIN', :'user')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'user') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'user', :'user') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'user', :'user')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'user') \gexec
SQL

url="postgres://$pg_user:$pg_user@127.0.0.1:$port/$pg_user?sslmode=disable"
log "PostgreSQL $PG_VERSION is up; the test reads LLMRETRY_PG_URL=$url"
echo "$url"
