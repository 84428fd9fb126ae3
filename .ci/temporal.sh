#!/usr/bin/env bash
# Starts a local Temporal development server (the Temporal CLI's
# `temporal server start-dev`, in memory, without its web UI) for the
# temporalretry integration test, and prints its address on stdout, as the
# one line this script writes there:
#
#	export LLMRETRY_TEMPORAL_ADDR="$(bash .ci/temporal.sh)"
#
# `bash .ci/temporal.sh stop` stops the server this script started, and
# `bash .ci/temporal.sh build` only builds the CLI (.ci/run starts that
# first, in the background, so that the build overlaps the other checks).
# Everything else goes to stderr, so the address can be captured. (Run it,
# do not source it: it sets -euo pipefail for itself.)
#
# Idempotent: it builds the CLI from the Go module proxy with go install
# only when this version's binary is missing from its folder (on a fresh
# machine with 2 cores, several minutes: see the README), and starts the
# server only when nothing answers on its port. The server runs in the
# background, its state in memory, its log in the folder.
#
# Settings, from the environment, with their defaults:
#	TEMPORAL_CLI_VERSION  v1.5.1 (github.com/temporalio/cli, Temporal Server 1.29)
#	TEMPORAL_DIR          ${XDG_CACHE_HOME:-$HOME/.cache}/llmretry-temporal: the binary, under
#	                      its version, and each port's server log and pid file
#	TEMPORAL_PORT         7233, the frontend's gRPC port, on 127.0.0.1
set -euo pipefail

log() { echo "temporal.sh: $*" >&2; }

# since prints the seconds from $1 (a `date +%s.%N`) to now, to a tenth.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

version=${TEMPORAL_CLI_VERSION:-v1.5.1}
dir=${TEMPORAL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llmretry-temporal}
port=${TEMPORAL_PORT:-7233}
bin="$dir/$version/temporal"
pidfile="$dir/server-$port.pid"
logfile="$dir/server-$port.log"
addr="127.0.0.1:$port"

# ours reports whether the pid file names a live server that this script
# started: a stale file's number may be another process's by now.
ours() {
	[ -f "$pidfile" ] || return 1
	local pid
	pid=$(cat "$pidfile")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
		tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "server start-dev"
}

if [ "${1:-}" = stop ]; then
	if ours; then
		pid=$(cat "$pidfile")
		log "stopping the server on $addr (pid $pid)"
		kill "$pid"
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	fi
	rm -f "$pidfile"
	exit 0
fi

if [ ! -x "$bin" ]; then
	log "building the Temporal CLI $version with go install, from the module proxy (minutes)"
	mkdir -p "$dir/$version"
	started=$(date +%s.%N)
	# Outside any module, and with no flags of the caller's, which
	# `go install pkg@version` would refuse or apply to the CLI's build.
	(cd / && GOBIN="$dir/$version" GOFLAGS= GOWORK=off go install "github.com/temporalio/cli/cmd/temporal@$version") >&2
	log "built $bin in $(since "$started")s"
fi
if [ "${1:-}" = build ]; then
	exit 0
fi

# healthy reports whether the server serves, with the namespace "default"
# that clients use registered: the frontend may serve before it is.
healthy() {
	"$bin" operator cluster health --address "$addr" 2>/dev/null | grep -q SERVING &&
		"$bin" operator namespace describe --address "$addr" --namespace default >/dev/null 2>&1
}

if healthy; then
	log "a server already answers on $addr"
else
	mkdir -p "$dir"
	started=$(date +%s.%N)
	# Its output goes to the log, not to this script's stdout, which a
	# caller's $(...) reads until every writer has closed it.
	nohup "$bin" server start-dev --headless --ip 127.0.0.1 --port "$port" \
		--db-filename '' --log-level warn >"$logfile" 2>&1 </dev/null &
	echo $! >"$pidfile"
	# Wait for the frontend to serve, for at most 60 s.
	for _ in $(seq 1 300); do
		if healthy; then
			break
		fi
		if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
			cat "$logfile" >&2
			log "the server exited"
			exit 1
		fi
		sleep 0.2
	done
	if ! healthy; then
		cat "$logfile" >&2
		log "the server did not answer on $addr within 60s"
		exit 1
	fi
	log "Temporal's development server is up on $addr after $(since "$started")s (log: $logfile)"
fi
echo "$addr"
