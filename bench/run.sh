#!/usr/bin/env bash
# run.sh runs the benchmark suite side by side with the peers, saves the raw
# output and prints it as a benchstat table, then as ratios to the fastest
# peer per case (cmd/ratios).
#
# Environment (all optional):
#   COUNT=10           runs of each benchmark (-count); COUNT=1 for a smoke test
#   BENCH=.            which benchmarks (-bench), e.g. BENCH='FirstTry|TwoFailures'
#   BENCHTIME=         -benchtime, e.g. 1x; empty means go test's default (1s)
#   OUT=results/DATE-COMMIT.txt  where the raw output goes, relative to bench/
#
# Needs only the Go toolchain: benchstat is fetched by `go run` at a pinned
# version through the module proxy.
set -euo pipefail

cd "$(dirname "$0")"

COUNT="${COUNT:-10}"
BENCH="${BENCH:-.}"
BENCHTIME="${BENCHTIME:-}"
OUT="${OUT:-results/$(date -u +%Y-%m-%d)-$(git rev-parse --short HEAD 2>/dev/null || echo wip).txt}"
mkdir -p "$(dirname "$OUT")"
BENCHSTAT=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

# Goroutines start on a fixed 2 KiB stack, not one sized from earlier GCs,
# so that Parked's stack-B/parked compares libraries fairly in one process,
# and Waiting's stack-B/waiting is the size each call's stack grew to.
export GODEBUG="${GODEBUG:+$GODEBUG,}adaptivestackstart=0"

args=(test -run '^$' -bench "$BENCH" -benchmem -count "$COUNT")
if [[ -n "$BENCHTIME" ]]; then
	args+=(-benchtime "$BENCHTIME")
fi

echo "# GODEBUG=$GODEBUG go ${args[*]}    ($(go version))" >&2
go "${args[@]}" . | tee "$OUT"

echo
echo "## benchstat $OUT"
go run "$BENCHSTAT" "$OUT"

echo
echo "## ratios to the fastest peer (peers: all but direct and llmretry)"
go run ./cmd/ratios "$OUT"
