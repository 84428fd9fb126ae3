package outage

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// playFleets plays every fleet scenario with fleets of every size, each
// run in a bubble of its own, in the dispatcher's order given by order (0:
// caller order); results[i][k] are scenario i's rows for FleetSizes[k].
func playFleets(t *testing.T, seed, order uint64) [][][]*Result {
	t.Helper()
	scenarios := FleetScenarios()
	all := make([][][]*Result, len(scenarios))
	for i := range scenarios {
		for _, n := range FleetSizes {
			var rows []*Result
			for _, st := range FleetStrategies(n) {
				rows = append(rows, playIn(t, &scenarios[i], st, seed, order))
			}
			all[i] = append(all[i], rows)
		}
	}
	return all
}

// fleetTargets are what the shared store's rows must meet, and what every
// fleet row must keep: no early sends, no parked callers.
func fleetTargets(sc *Scenario, n int, rows []*Result) []string {
	var bad []string
	for _, r := range rows {
		if r.Early != 0 || r.Parked != 0 {
			bad = append(bad, fmt.Sprintf("%s, N=%d, %s: %d early sends, %d parked, want 0", sc.Name, n, r.Strategy, r.Early, r.Parked))
		}
		if r.Strategy != nameFleetShared {
			continue
		}
		switch sc.Name {
		case "rate-limit", "failover-overload":
			if r.Got429 > 10 || r.Answered != r.Requests {
				bad = append(bad, fmt.Sprintf("%s, N=%d, shared store: %d answers of 429 and %d of %d answered, want at most 10 and all", sc.Name, n, r.Got429, r.Answered, r.Requests))
			}
		case "hard-down":
			if r.P95 > 4e9 {
				bad = append(bad, fmt.Sprintf("%s, N=%d, shared store: p95 %v, want at most 4 s", sc.Name, n, r.P95))
			}
		}
	}
	return bad
}

// TestFleetTargets plays the fleets and fails when the shared store's
// rows draw more than 10 answers of 429 in rate-limit or
// failover-overload, answer fewer than all there, or take longer than
// 4 s at p95 in hard-down; or when any fleet row sends early or parks a
// caller.
func TestFleetTargets(t *testing.T) {
	scenarios := FleetScenarios()
	res := fleetResults(t)
	for i := range scenarios {
		for k, n := range FleetSizes {
			for _, line := range fleetTargets(&scenarios[i], n, res[i][k]) {
				t.Error(line)
			}
		}
	}
}

// A fleet of processes that share nothing misses the targets: the check
// can fail.
func TestFleetTargetsCanFail(t *testing.T) {
	sc := FleetScenarios()[1] // rate-limit
	if sc.Name != "rate-limit" {
		t.Fatalf("FleetScenarios()[1] is %s, want rate-limit", sc.Name)
	}
	st := FleetStrategies(16)[1] // paced, a Breaker per process
	r := playOne(t, &sc, st, testSeed)
	r.Strategy = nameFleetShared
	if bad := fleetTargets(&sc, 16, []*Result{r}); len(bad) == 0 {
		t.Errorf("fleetTargets passed a fleet that shares nothing: %d answers of 429", r.Got429)
	}
}

// TestFleetReplayIsDeterministic plays the fleets again with the
// requests due at one instant in a shuffled order. The rows of processes
// that share nothing must be the same byte for byte. The shared store's
// may differ in their times, as a real fleet's would: which of the
// writes due at one instant lands first is the scheduler's, not the
// dispatcher's; but not in what is answered, nor in the 429s drawn.
func TestFleetReplayIsDeterministic(t *testing.T) {
	if testing.Short() {
		t.Skip("plays the fleets once more")
	}
	first := fleetResults(t)
	again := playFleets(t, testSeed, 1)
	scenarios := FleetScenarios()
	for i := range scenarios {
		for k, n := range FleetSizes {
			for j, r := range again[i][k] {
				w := first[i][k][j]
				if r.Strategy == nameFleetShared {
					if r.Answered != w.Answered || r.Got429 != w.Got429 {
						t.Errorf("%s, N=%d, %s: replay answered %d with %d answers of 429, first play %d with %d", scenarios[i].Name, n, r.Strategy, r.Answered, r.Got429, w.Answered, w.Got429)
					}
					continue
				}
				var a, b strings.Builder
				WriteFleetMarkdown(&a, &scenarios[i], []int{n}, [][]*Result{{w}})
				WriteFleetMarkdown(&b, &scenarios[i], []int{n}, [][]*Result{{r}})
				if a.String() != b.String() {
					t.Errorf("%s, N=%d, %s: the replay differs:\n%s", scenarios[i].Name, n, r.Strategy, lineDiff(a.String(), b.String()))
				}
			}
		}
	}
}

// fleetPlayed is one play of the fleets with the test seed, shared by
// the tests that only read it.
var fleetPlayed [][][]*Result

func fleetResults(t *testing.T) [][][]*Result {
	t.Helper()
	if fleetPlayed == nil {
		fleetPlayed = playFleets(t, testSeed, 0)
	}
	return fleetPlayed
}

// fleetReport is the fleet section of the report; svg, when set, is the
// path of its picture.
func fleetReport(res [][][]*Result, svg func() string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### Fleets (seed %d)\n\n", testSeed)
	b.WriteString("Written by `cd bench && go test ./outage -run TestWriteFleetReport -update`. Each scenario's arrivals spread over N processes, each with its own chain and Breakers on the same two providers; the rows differ in what the processes share: nothing (a Breaker per process, not pacing or pacing), or the Breakers' state, through one `llmretrytest.MemoryStore` whose every call takes 2 ms of virtual time. Store calls per request counts every Load, CompareAndSwap and Watch of the run over its requests.\n\n")
	scenarios := FleetScenarios()
	for i := range scenarios {
		WriteFleetMarkdown(&b, &scenarios[i], FleetSizes, res[i])
		if svg != nil && scenarios[i].Name == fleetSVGScenario {
			fmt.Fprintf(&b, "![%s, N=16: requests sent and answers of 429 per 10 s, by row](%s)\n\n", scenarios[i].Name, svg())
		}
	}
	return b.String()
}

// The scenario and fleet the picture shows, and its file in results/.
const (
	fleetSVGScenario = "failover-overload"
	fleetSVG         = "fleet-failover-overload.svg"
)

// The markers in BENCHMARKS.md between which TestWriteFleetReport writes.
const (
	fleetBegin = "<!-- begin fleet report: written by `cd bench && go test ./outage -run TestWriteFleetReport -update`; do not edit by hand -->\n"
	fleetEnd   = "<!-- end fleet report -->\n"
)

// TestWriteFleetReport writes results/fleet.md, the fleet picture, and
// the fleet section of BENCHMARKS.md between its markers, when run with
// -update.
func TestWriteFleetReport(t *testing.T) {
	if !*update {
		t.Skip("run with -update to write the report")
	}
	res := fleetResults(t)
	scenarios := FleetScenarios()
	for i := range scenarios {
		if scenarios[i].Name != fleetSVGScenario {
			continue
		}
		var b bytes.Buffer
		if err := WriteFleetSVG(&b, &scenarios[i], 16, res[i][len(FleetSizes)-1]); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("results", fleetSVG), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	local := fleetReport(res, func() string { return fleetSVG })
	if err := os.WriteFile(filepath.Join("results", "fleet.md"), []byte(local), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString(local)
	root := fleetReport(res, func() string { return "bench/outage/results/" + fleetSVG })
	if err := spliceBetween(benchmarksMD, fleetBegin, fleetEnd, demote(root)); err != nil {
		t.Fatal(err)
	}
}

// spliceBetween replaces what lies between the markers begin and end in
// the file at path with text.
func spliceBetween(path, begin, end, text string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	before, rest, ok := strings.Cut(string(old), begin)
	if !ok {
		return fmt.Errorf("%s: no line %q", path, strings.TrimSpace(begin))
	}
	_, after, ok := strings.Cut(rest, end)
	if !ok {
		return fmt.Errorf("%s: no line %q after the first marker", path, strings.TrimSpace(end))
	}
	return os.WriteFile(path, []byte(before+begin+"\n"+text+end+after), 0o644)
}
