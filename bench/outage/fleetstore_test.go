package outage

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var matrix = flag.Bool("matrix", false, "play the shared-store matrix: store latencies, timeouts, fleet sizes and assignments, with replays")

// storeSetups are the stores the matrix plays: a database next door, one
// a little further at the default StoreTimeout, and one across a region
// with a StoreTimeout sized to it.
var storeSetups = []StoreSetup{
	{Latency: 2 * time.Millisecond},
	{Latency: 5 * time.Millisecond},
	{Latency: 20 * time.Millisecond, Timeout: 250 * time.Millisecond},
}

// matrixRow is one cell of the matrix: what the targets and the replays
// compare.
type matrixRow struct {
	sc        string
	n         int
	strategy  string
	r         *Result
	callsSent float64 // store calls per request sent
}

// outcome is what replays of one seed must give alike, as the tables
// print it: the times to a tenth of a second, since which of two writes
// due at one instant lands first (the scheduler's, in a fleet as in
// virtual time) may move a call by a store call's latency.
func (m matrixRow) outcome() string {
	r := m.r
	return fmt.Sprintf("answered %d, 429s %d, sent %d, p50 %s, p95 %s, p95 to any outcome %s, late %d, parked %d, early %d",
		r.Answered, r.Got429, r.Sent, seconds(r.P50), seconds(r.P95), seconds(r.P95Done), r.Late, r.Parked, r.Early)
}

// TestFleetStoreMatrix plays rate-limit, failover-overload and hard-down
// over fleets of 4 and 16 processes that share a store, for each store
// setup and both assignments, three times, and checks what the shared
// rows must meet: at most 10 answers of 429 and every caller answered in
// rate-limit and failover-overload, p95 at most 4 s in hard-down, no
// caller returning after its deadline, at most 4 store calls per request
// sent, and the same outcomes on every replay. Run with -matrix.
func TestFleetStoreMatrix(t *testing.T) {
	if !*matrix {
		t.Skip("run with -matrix")
	}
	var table strings.Builder
	table.WriteString("| scenario | N | store | answered | 429s | p95 | p95 to any outcome | late | store calls/request sent |\n|---|--:|---|--:|--:|--:|--:|--:|--:|\n")
	for _, sc := range FleetScenarios() {
		for _, n := range FleetSizes {
			for _, s := range storeSetups {
				for _, skew := range []bool{false, true} {
					st := SharedFleet(n, s, skew)
					var rows []matrixRow
					for replay := range 3 {
						r := playIn(t, &sc, st, testSeed, 0)
						rows = append(rows, matrixRow{sc.Name, n, st.Name, r, float64(r.StoreCalls) / float64(max(r.Sent, 1))})
						if replay > 0 && rows[replay].outcome() != rows[0].outcome() {
							t.Errorf("%s, N=%d, %s: replay %d differs:\n\t%s\nfirst:\n\t%s", sc.Name, n, st.Name, replay, rows[replay].outcome(), rows[0].outcome())
						}
					}
					m := rows[0]
					r := m.r
					fmt.Fprintf(&table, "| %s | %d | %s | %d/%d | %d | %s | %s | %d | %.2f |\n", sc.Name, n, st.Name, r.Answered, r.Requests, r.Got429, seconds(r.P95), seconds(r.P95Done), r.Late, m.callsSent)
					for _, bad := range matrixTargets(m) {
						t.Error(bad)
					}
				}
			}
		}
	}
	t.Log("\n" + table.String())
	if *update {
		md := "Written by `cd bench && go test ./outage -run TestFleetStoreMatrix -matrix -update`: the shared-store rows of rate-limit, failover-overload and hard-down, seed 1, over fleets of 4 and 16 processes, for three stores (in memory, each call taking the latency shown) and two ways of assigning callers to processes (round-robin, and skewed: every other caller to process 0). Store calls per request sent counts every Load, CompareAndSwap and Watch of the run over the requests that reached a provider.\n\n" + table.String()
		if err := os.WriteFile(filepath.Join("results", "fleet-matrix.md"), []byte(md), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// matrixTargets are the targets a shared row misses.
func matrixTargets(m matrixRow) []string {
	var bad []string
	r := m.r
	where := fmt.Sprintf("%s, N=%d, %s", m.sc, m.n, m.strategy)
	switch m.sc {
	case "rate-limit", "failover-overload":
		if r.Got429 > 10 || r.Answered != r.Requests {
			bad = append(bad, fmt.Sprintf("%s: %d answers of 429, %d of %d answered; want at most 10 and all", where, r.Got429, r.Answered, r.Requests))
		}
	case "hard-down":
		if r.P95 > 4*time.Second {
			bad = append(bad, fmt.Sprintf("%s: p95 %v, want at most 4 s", where, r.P95))
		}
	}
	if r.Late > 0 {
		bad = append(bad, fmt.Sprintf("%s: %d callers returned after their deadline", where, r.Late))
	}
	if m.callsSent > 4 {
		bad = append(bad, fmt.Sprintf("%s: %.2f store calls per request sent, want at most 4", where, m.callsSent))
	}
	return bad
}
