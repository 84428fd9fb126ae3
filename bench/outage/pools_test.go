package outage

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// playPools plays every pool scenario with fleets of every size, each run
// in a bubble of its own; results[i][k] are scenario i's rows for
// PoolSizes[k], in the order of PoolStrategies.
func playPools(t *testing.T, seed uint64) [][][]*Result {
	t.Helper()
	scenarios := PoolScenarios()
	all := make([][][]*Result, len(scenarios))
	for i := range scenarios {
		for _, n := range PoolSizes {
			var rows []*Result
			for _, st := range PoolStrategies(n) {
				rows = append(rows, playIn(t, &scenarios[i], st, seed, 0))
			}
			all[i] = append(all[i], rows)
		}
	}
	return all
}

// poolPlayed is one play of the pool scenarios with the test seed, shared
// by the tests that only read it.
var poolPlayed [][][]*Result

func poolResults(t *testing.T) [][][]*Result {
	t.Helper()
	if poolPlayed == nil {
		poolPlayed = playPools(t, testSeed)
	}
	return poolPlayed
}

// row is the row of strategy name among rows; nil when there is none.
func row(rows []*Result, name string) *Result {
	for _, r := range rows {
		if r.Strategy == name {
			return r
		}
	}
	return nil
}

// binSum sums the bins of bins that cover [from, to).
func binSum(bins []int, from, to time.Duration) int {
	n := 0
	for j, v := range bins {
		if at := time.Duration(j) * bin; at >= from && at < to {
			n += v
		}
	}
	return n
}

// poolTargets are what the pool row must meet in one scenario played by
// a fleet of n processes (rows), healthy being the pool row of the same
// fleet in three-regions (for region-down):
//
//   - two-keys: at most 1% of its requests answered 429, every request
//     answered within its deadline, at least 90% of the summed capacity
//     used; and every other row (the ordered chain, each gateway) draws
//     more 429s or answers fewer;
//   - region-down: every request answered, and p95 within 10% of the
//     healthy run's;
//   - spillover: at most 1% 429s and every request answered; no request
//     sent to the pay-as-you-go tier while the load is below the
//     provisioned capacity (the first wave), and the provisioned tier's
//     answers in the second wave at least 90% of what it can answer then.
func poolTargets(sc *Scenario, n int, rows []*Result, healthy *Result) []string {
	var bad []string
	p := row(rows, namePool)
	if p == nil {
		return []string{fmt.Sprintf("%s, N=%d: no %s row", sc.Name, n, namePool)}
	}
	where := fmt.Sprintf("%s, N=%d, %s", sc.Name, n, namePool)
	all := func() {
		if p.Answered != p.Requests {
			bad = append(bad, fmt.Sprintf("%s: answered %d of %d within the deadline, want all", where, p.Answered, p.Requests))
		}
	}
	few429 := func() {
		if 100*p.Got429 > p.Requests {
			bad = append(bad, fmt.Sprintf("%s: %d of %d requests answered 429 (%s), want at most 1%%", where, p.Got429, p.Requests, percent(p.Got429, p.Requests)))
		}
	}
	switch sc.Name {
	case "two-keys":
		few429()
		all()
		if u := usedShare(sc, p); u < 0.90 {
			bad = append(bad, fmt.Sprintf("%s: used %.1f%% of the summed capacity, want at least 90%%", where, 100*u))
		}
		for _, o := range rows {
			if o != p && o.Got429 <= p.Got429 && o.Answered >= p.Answered {
				bad = append(bad, fmt.Sprintf("%s, N=%d: %s drew %d answers of 429 and answered %d; %s drew %d and answered %d: want the other row to draw more 429s or answer fewer",
					sc.Name, n, o.Strategy, o.Got429, o.Answered, namePool, p.Got429, p.Answered))
			}
		}
	case "region-down":
		all()
		if healthy == nil {
			bad = append(bad, where+": no healthy run to compare with")
		} else if float64(p.P95) > 1.1*float64(healthy.P95) {
			bad = append(bad, fmt.Sprintf("%s: p95 %s, want within 10%% of the healthy run's %s", where, seconds(p.P95), seconds(healthy.P95)))
		}
	case "spillover":
		few429()
		all()
		first := sc.Waves[0].Until
		for d, prov := range sc.providers() {
			if prov.Tier == 0 {
				if spilled := sentAbove(sc, p, 0, 0, first); spilled > 0 {
					bad = append(bad, fmt.Sprintf("%s: %d requests sent to a higher tier before %v, while the load was below %s's capacity, want none", where, spilled, first, prov.Name))
				}
				end := sc.span()
				answered := binSum(p.SentBinsBy[d], first, end) - binSum(p.Bins429By[d], first, end)
				can := prov.capacity(sc.Tokens.meanCost()) * (end - first).Seconds()
				if float64(answered) < 0.9*can {
					bad = append(bad, fmt.Sprintf("%s: %s answered %d requests sent in [%v, %v), %.0f%% of the %.0f it can, want at least 90%% while the higher tier takes the rest",
						where, prov.Name, answered, first, end, 100*float64(answered)/can, can))
				}
			}
		}
	}
	return bad
}

// sentAbove counts r's requests sent in [from, to) to deployments of a
// tier above tier.
func sentAbove(sc *Scenario, r *Result, tier int, from, to time.Duration) int {
	n := 0
	for d, prov := range sc.providers() {
		if prov.Tier > tier {
			n += binSum(r.SentBinsBy[d], from, to)
		}
	}
	return n
}

// allPoolTargets lists every target missed over every pool scenario and
// fleet size.
func allPoolTargets(scenarios []Scenario, res [][][]*Result) []string {
	var bad []string
	healthy := -1
	for i := range scenarios {
		if scenarios[i].Name == "three-regions" {
			healthy = i
		}
	}
	for i := range scenarios {
		for k, n := range PoolSizes {
			var h *Result
			if healthy >= 0 {
				h = row(res[healthy][k], namePool)
			}
			bad = append(bad, poolTargets(&scenarios[i], n, res[i][k], h)...)
		}
	}
	return bad
}

// strictPool makes TestPoolTargets fail on the targets the pool is known
// to miss (BENCHMARKS.md, Pools, says which and why) as on the others.
var strictPool = flag.Bool("strict-pool", false, "fail TestPoolTargets on the pool targets known to be missed, too")

// knownPoolMiss reports whether line is a target the published pool
// misses: an ordered chain of paced Breakers that draws no 429s and
// answers every call, as does round-robin in one play, so the pool cannot
// beat it on 429s or answers; and the spillover tier taking a few
// requests while estimates charged up front hold provisioned back.
func knownPoolMiss(line string) bool {
	return strings.Contains(line, "want the other row to draw more 429s or answer fewer") ||
		strings.Contains(line, "sent to a higher tier before")
}

// TestPoolTargets plays the pool scenarios and fails on every target of
// poolTargets the pool row misses, at every fleet size, and when any
// llmretry row sends early or returns after its caller's deadline. A
// target known to be missed is logged, and fails only with -strict-pool.
func TestPoolTargets(t *testing.T) {
	scenarios := PoolScenarios()
	res := poolResults(t)
	for _, line := range allPoolTargets(scenarios, res) {
		if knownPoolMiss(line) && !*strictPool {
			t.Log("known miss: " + line)
			continue
		}
		t.Error(line)
	}
	for i := range scenarios {
		for k, n := range PoolSizes {
			for _, r := range res[i][k] {
				if r.Breaker && (r.Early != 0 || r.Late != 0) {
					t.Errorf("%s, N=%d, %s: %d early sends, %d callers returned after their deadline, want 0", scenarios[i].Name, n, r.Strategy, r.Early, r.Late)
				}
			}
		}
	}
}

// poolScenario returns the pool scenario called name.
func poolScenario(t *testing.T, name string) *Scenario {
	t.Helper()
	scenarios := PoolScenarios()
	for i := range scenarios {
		if scenarios[i].Name == name {
			return &scenarios[i]
		}
	}
	t.Fatalf("no pool scenario %q", name)
	return nil
}

// A pool whose deployments lose the providers' rate-limit headers and
// their Retry-After has nothing to choose, pace or back off by, and draws
// its 429s: the targets catch it, and the pool as published, in the same
// play, does not draw them. (Without the rate-limit headers alone it
// learns from each 429's Retry-After, and draws 5 of 507: just within
// the 1%.)
func TestPoolTargetsCanFail(t *testing.T) {
	sc := poolScenario(t, "two-keys")
	limits := []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", "Retry-After"}
	broken := Strategy{Name: namePool, Breaker: true, Paced: true, build: func(e *Env) doFunc {
		for i := range e.transports {
			e.transports[i] = dropNamed{e.transports[i], limits}
		}
		return llmretryFleet(1, true)(e)
	}}
	r := playOne(t, sc, broken, testSeed)
	got := strings.Join(poolTargets(sc, 1, []*Result{r}, nil), "\n")
	if !strings.Contains(got, "requests answered 429") {
		t.Errorf("poolTargets() = %q, want a line on the 429s", got)
	}
	r = playOne(t, sc, PoolStrategies(1)[0], testSeed)
	if got := strings.Join(poolTargets(sc, 1, []*Result{r}, nil), "\n"); strings.Contains(got, "requests answered 429") {
		t.Errorf("unbroken: poolTargets() = %q, want no line on the 429s", got)
	}
}

// TestPoolTargetsRows checks the targets' rules on hand-made rows: the
// comparison with the other rows, the region-down p95 against the
// healthy run's, and the spillover tier's rules.
func TestPoolTargetsRows(t *testing.T) {
	keys := poolScenario(t, "two-keys")
	down := poolScenario(t, "region-down")
	spill := poolScenario(t, "spillover")
	n := keys.Requests
	pool := func(got429, answered int) *Result {
		return &Result{Strategy: namePool, Requests: n, Answered: answered, Got429: got429}
	}
	other := func(name string, got429, answered int) *Result {
		return &Result{Strategy: name, Requests: n, Answered: answered, Got429: got429}
	}
	// Per 10 s bins over 5 min for the two deployments of spillover.
	bins := func(per10s ...int) []int {
		b := make([]int, 30)
		for j := range b {
			b[j] = per10s[0]
			if j >= 15 {
				b[j] = per10s[1]
			}
		}
		return b
	}
	oneIn := func(b []int, j int) []int { b[j]++; return b }
	spillRow := func(prov, paygo []int) *Result {
		m := spill.requests()
		return &Result{Strategy: namePool, Requests: m, Answered: m,
			SentBinsBy: [][]int{prov, paygo}, Bins429By: [][]int{make([]int, 30), make([]int, 30)}}
	}
	tests := []struct {
		name    string
		sc      *Scenario
		rows    []*Result
		healthy *Result
		want    []string // substrings of the lines poolTargets must return, one each
	}{{
		name: "met",
		sc:   keys,
		rows: []*Result{pool(0, n), other(nameOrdered, 1, n), other(nameRandom, 0, n-1)},
	}, {
		name: "other_row_as_good",
		sc:   keys,
		rows: []*Result{pool(2, n), other(nameRoundRobin, 2, n)},
		want: []string{"round-robin drew 2 answers of 429 and answered"},
	}, {
		name: "too_many_429s_and_unanswered",
		sc:   keys,
		rows: []*Result{pool(n/50, n*8/10)},
		want: []string{"requests answered 429", "within the deadline, want all", "of the summed capacity"},
	}, {
		name:    "down_p95_too_slow",
		sc:      down,
		rows:    []*Result{{Strategy: namePool, Requests: 10, Answered: 10, P95: 2300 * time.Millisecond}},
		healthy: &Result{P95: 2 * time.Second},
		want:    []string{"p95 2.3 s, want within 10% of the healthy run's 2.0 s"},
	}, {
		name:    "down_p95_close",
		sc:      down,
		rows:    []*Result{{Strategy: namePool, Requests: 10, Answered: 10, P95: 2200 * time.Millisecond}},
		healthy: &Result{P95: 2 * time.Second},
	}, {
		// 8.9 a 10 s is the provisioned capacity at the scenario's mean
		// cost: 9 in the second wave uses it; one request to
		// pay-as-you-go in the first spills needlessly.
		name: "spill_needless",
		sc:   spill,
		rows: []*Result{spillRow(bins(6, 9), oneIn(bins(0, 4), 3))},
		want: []string{"sent to a higher tier before 2m30s"},
	}, {
		name: "spill_provisioned_underused",
		sc:   spill,
		rows: []*Result{spillRow(bins(6, 7), bins(0, 6))},
		want: []string{"provisioned answered 105 requests"},
	}, {
		name: "spill_met",
		sc:   spill,
		rows: []*Result{spillRow(bins(6, 9), bins(0, 4))},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := poolTargets(tc.sc, 1, tc.rows, tc.healthy)
			if len(got) != len(tc.want) {
				t.Fatalf("poolTargets() = %q, want %d lines with %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("poolTargets()[%d] = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// poolReport is the pools section of the report; svg, when set, names
// the picture of scenario i.
func poolReport(scenarios []Scenario, res [][][]*Result, svg func(i int) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### Pools (seed %d)\n\n", testSeed)
	b.WriteString("Written by `cd bench && go test ./outage -run TestWritePoolReport -update`. One model served by several deployments, each behind buckets of requests and of tokens that send OpenAI's rate-limit headers for both; each request costs 100–500 input and 50–250 output tokens and asks for a budget of 300, and llmretry's rows estimate it (Backend.Estimate) as its input plus that budget. The arrivals are spread over N processes, caller i to process i mod N. llmretry's rows (the pool, and the same deployments as an ordered chain) give every deployment a paced Breaker, shared by the N processes through one `llmretrytest.MemoryStore` (2 ms a call), under the deployment's name; the gateways' rows are modelled from their documentation (`bench/outage/poolrows.go`) and keep their counts in each process. 429s are requests answered 429, as a share of the requests; capacity used is the answers over what the buckets refill during the arrivals, at the mean cost; spillover is the share of answers from the pay-as-you-go tier.\n\n")
	for i := range scenarios {
		WritePoolMarkdown(&b, &scenarios[i], PoolSizes, res[i])
		if svg != nil {
			fmt.Fprintf(&b, "![%s, N=%d: requests sent to each deployment and answers of 429 per 10 s, by row](%s)\n\n", scenarios[i].Name, poolSVGSize, svg(i))
		}
	}
	bad := allPoolTargets(scenarios, res)
	b.WriteString("Targets (`TestPoolTargets`):")
	if len(bad) == 0 {
		b.WriteString(" all met.\n\n")
	} else {
		b.WriteString(" MISSED:\n\n")
		for _, line := range bad {
			b.WriteString("- " + line + "\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// poolSVGSize is the fleet the pictures show.
const poolSVGSize = 16

// The markers in BENCHMARKS.md between which TestWritePoolReport writes.
const (
	poolBegin = "<!-- begin pool report: written by `cd bench && go test ./outage -run TestWritePoolReport -update`; do not edit by hand -->\n"
	poolEnd   = "<!-- end pool report -->\n"
)

// TestWritePoolReport writes results/pools.md, one picture per pool
// scenario, and the pools section of BENCHMARKS.md between its markers,
// when run with -update.
func TestWritePoolReport(t *testing.T) {
	if !*update {
		t.Skip("run with -update to write the report")
	}
	scenarios := PoolScenarios()
	res := poolResults(t)
	svg := func(i int) string { return "pool-" + scenarios[i].Name + ".svg" }
	k := -1
	for j, n := range PoolSizes {
		if n == poolSVGSize {
			k = j
		}
	}
	if k < 0 {
		t.Fatalf("PoolSizes %v has no fleet of %d", PoolSizes, poolSVGSize)
	}
	for i := range scenarios {
		var b bytes.Buffer
		if err := WritePoolSVG(&b, &scenarios[i], poolSVGSize, res[i][k]); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("results", svg(i)), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	local := poolReport(scenarios, res, svg)
	if err := os.WriteFile(filepath.Join("results", "pools.md"), []byte(local), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString(local)
	root := poolReport(scenarios, res, func(i int) string { return "bench/outage/results/" + svg(i) })
	if err := spliceBetween(benchmarksMD, poolBegin, poolEnd, demote(root)); err != nil {
		t.Fatal(err)
	}
}
