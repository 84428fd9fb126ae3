package outage

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/llmretry/llmretry/llmretrytest"
)

// A fleet plays a scenario's arrivals spread over n processes: caller i
// goes to process i mod n, and each process has its own chain, with its
// own Breakers, on the same two providers. The rows differ in what the
// processes share: nothing (a Breaker per process, without and with
// pacing), or the Breakers' state, through one store that every process
// reaches in storeLatency a call.

// FleetSizes are the fleets the tables show.
var FleetSizes = []int{4, 16}

// storeLatency is what one call to the shared store takes in the fleet
// rows: a round trip to a database on the same network.
const storeLatency = 2 * time.Millisecond

// The fleet rows' names.
const (
	nameFleetBreaker = "a Breaker per process"
	nameFleetPaced   = "a paced Breaker per process"
	nameFleetShared  = "one shared store (2 ms a call)"
)

// FleetScenarios are the scenarios the fleet tables play: those where
// what a process learns matters to the others.
func FleetScenarios() []Scenario {
	var out []Scenario
	for _, sc := range Scenarios() {
		switch sc.Name {
		case "rate-limit", "failover-overload", "hard-down":
			out = append(out, sc)
		}
	}
	return out
}

// FleetStrategies are the rows of a fleet of n processes.
func FleetStrategies(n int) []Strategy {
	return []Strategy{
		{Name: nameFleetBreaker, Breaker: true, build: fleetOf(n, unpacedBreakers, false)},
		{Name: nameFleetPaced, Breaker: true, Paced: true, build: fleetOf(n, pacedBreakers, false)},
		{Name: nameFleetShared, Breaker: true, Paced: true, build: fleetOf(n, pacedBreakers, true)},
	}
}

// fleetOf builds n processes' chains, with breakers as mode says, their
// Breakers sharing one store when shared is set.
func fleetOf(n, mode int, shared bool) func(e *Env) doFunc {
	return sharedFleetOf(n, mode, shared, StoreSetup{Latency: storeLatency}, roundRobin)
}

// StoreSetup is the store a fleet shares: what each call takes, and the
// Breakers' StoreTimeout (0: the default).
type StoreSetup struct {
	Latency, Timeout time.Duration
}

// roundRobin sends caller i to process i mod n.
func roundRobin(i, n int) int { return i % n }

// skewed sends every other caller to process 0 and spreads the rest over
// the others, as a load balancer that favours one process would.
func skewed(i, n int) int {
	if n == 1 || i%2 == 0 {
		return 0
	}
	return 1 + (i/2)%(n-1)
}

// SharedFleet is the row of a fleet of n processes whose paced Breakers
// share a store set up as s, callers assigned to processes round-robin,
// or skewed (every other caller to process 0).
func SharedFleet(n int, s StoreSetup, skew bool) Strategy {
	assign := roundRobin
	name := fmt.Sprintf("shared store, %v a call", s.Latency)
	if s.Timeout > 0 {
		name += fmt.Sprintf(", StoreTimeout %v", s.Timeout)
	}
	if skew {
		assign, name = skewed, name+", skewed"
	}
	return Strategy{Name: name, Breaker: true, Paced: true, build: sharedFleetOf(n, pacedBreakers, true, s, assign)}
}

// sharedFleetOf builds n processes' chains, with breakers as mode says,
// their Breakers sharing one store set up as s when shared is set, and
// caller i going to process assign(i, n).
func sharedFleetOf(n, mode int, shared bool, s StoreSetup, assign func(i, n int) int) func(e *Env) doFunc {
	return func(e *Env) doFunc {
		var store *llmretrytest.MemoryStore
		if shared {
			store = &llmretrytest.MemoryStore{Latency: s.Latency}
			e.storeCalls = func() int64 {
				c := store.Calls()
				return c.Loads + c.Swaps + c.Watches
			}
		}
		procs := make([]doFunc, n)
		for i := range procs {
			// A nil *Memory in the interface would be a store that is
			// there: pass a nil interface for none.
			if store != nil {
				procs[i] = llmRetryChainOf(e, mode, store, s.Timeout)
			} else {
				procs[i] = llmRetryChainOf(e, mode, nil, 0)
			}
		}
		return func(ctx context.Context, id int) (int, error) { return procs[assign(id, n)](ctx, id) }
	}
}

// WriteFleetMarkdown writes the table of one scenario played by fleets of
// every size: one row per fleet size and strategy.
func WriteFleetMarkdown(w io.Writer, sc *Scenario, sizes []int, results [][]*Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "#### %s, spread over a fleet\n\n%s; caller i goes to process i mod N.\n\n", sc.Name, sc.About)
	b.WriteString("| N | strategy | answered | p50 | p95 | p95 to any outcome | sent/answer | answered 429 | early sends | parked | store calls/request |\n")
	b.WriteString("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for i, n := range sizes {
		for _, r := range results[i] {
			calls := "-"
			if r.StoreCalls > 0 {
				calls = fmt.Sprintf("%.1f", float64(r.StoreCalls)/float64(r.Requests))
			}
			fmt.Fprintf(&b, "| %d | %s | %s (%d) | %s | %s | %s | %s | %d | %d | %d | %s |\n",
				n, r.Strategy, percent(r.Answered, r.Requests), r.Answered,
				seconds(r.P50), seconds(r.P95), seconds(r.P95Done),
				ratio(r.SentPerAnswer(), r.Answered), r.Got429, r.Early, r.Parked, calls)
		}
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteFleetSVG draws one scenario played by a fleet of n processes, one
// line per row: requests sent per 10 s above, requests answered 429 per
// 10 s (by when they were sent) below.
func WriteFleetSVG(w io.Writer, sc *Scenario, n int, results []*Result) error {
	top, err := series(results, func(r *Result) []int { return r.SentBins })
	if err != nil {
		return err
	}
	top.Title.Text = fmt.Sprintf("%s over %d processes", sc.Name, n)
	top.Y.Label.Text = "requests sent per 10 s"
	bottom, err := series(results, func(r *Result) []int {
		b := make([]int, max(len(r.Bins429), len(r.SentBins)))
		copy(b, r.Bins429)
		return b
	})
	if err != nil {
		return err
	}
	bottom.Y.Label.Text = "requests answered 429 per 10 s (by send)"
	bottom.X.Label.Text = "minutes since the start of the run"
	top.X.Max = max(top.X.Max, bottom.X.Max)
	bottom.X.Max = top.X.Max
	c := vgsvg.New(9*vg.Inch, 6*vg.Inch)
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(12)}, draw.New(c))
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	_, err = c.WriteTo(w)
	return err
}
