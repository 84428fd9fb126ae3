// The OpenAI SDK draws its retry jitter from math/rand's global source;
// the benchmark seeds it, which Go 1.24+ ignores unless told otherwise.
//go:debug randseednop=0

package outage

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

var update = flag.Bool("update", false, "write the report and pictures to results/")

// testSeed is the seed of the published tables.
const testSeed = 1

// playAll plays every scenario with every strategy, each run in a bubble
// of its own, one after another: the OpenAI SDK's runs share math/rand's
// global source, so no two runs may overlap. order is play's: 0 for
// caller order.
func playAll(t *testing.T, seed, order uint64, scenarios []Scenario, strategies []Strategy) [][]*Result {
	t.Helper()
	all := make([][]*Result, len(scenarios))
	for i := range scenarios {
		for _, st := range strategies {
			all[i] = append(all[i], playIn(t, &scenarios[i], st, seed, order))
		}
	}
	return all
}

// playOne plays one scenario with one strategy in a bubble of its own, in
// caller order.
func playOne(t *testing.T, sc *Scenario, st Strategy, seed uint64) *Result {
	t.Helper()
	return playIn(t, sc, st, seed, 0)
}

// playIn is playOne in the dispatcher's order given by order.
func playIn(t *testing.T, sc *Scenario, st Strategy, seed, order uint64) *Result {
	t.Helper()
	var r *Result
	synctest.Test(t, func(*testing.T) {
		r = play(sc, st, seed, order)
	})
	return r
}

// published is one play of every scenario with the test seed, shared by
// the tests that only read it.
var published = struct {
	once    sync.Once
	results [][]*Result
}{}

func publishedResults(t *testing.T) [][]*Result {
	t.Helper()
	published.once.Do(func() {
		published.results = playAll(t, testSeed, 0, Scenarios(), Strategies())
	})
	if published.results == nil {
		t.Fatal("the first play failed")
	}
	return published.results
}

// TestInvariants plays every scenario and fails when llmretry sends early,
// leaves a caller parked at its deadline, or, with its Breaker, answers
// fewer requests than a peer; and when the paced row draws a 429 where
// only buckets send them, or answers fewer requests than any row.
func TestInvariants(t *testing.T) {
	scenarios := Scenarios()
	results := publishedResults(t)
	for i := range scenarios {
		for _, broken := range invariants(results[i]) {
			t.Errorf("%s: %s", scenarios[i].Name, broken)
		}
		for _, broken := range pacedInvariants(&scenarios[i], results[i]) {
			t.Errorf("%s: %s", scenarios[i].Name, broken)
		}
	}
	if !breakerBuilt {
		t.Log("llmretry + Breaker is not in this build: its assertions are skipped")
	}
}

// lineDiff returns the lines that differ between a and b.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var d strings.Builder
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			fmt.Fprintf(&d, "- %s\n+ %s\n", x, y)
		}
	}
	return d.String()
}

// TestChecksCanFail breaks llmretry's set-up on purpose and checks that
// each invariant catches it.
func TestChecksCanFail(t *testing.T) {
	scenarios := Scenarios()
	away := []Phase{{Until: time.Hour, Status: http.StatusTooManyRequests, RetryAfter: 45 * time.Second}}
	scenarios = append(scenarios, Scenario{
		Name: "both-away", Requests: 50, Over: time.Minute, Deadline: deadline,
		Primary: Provider{Name: "Primary", Answer: primaryAnswer, Phases: away},
		Second:  Provider{Name: "Secondary", Answer: secondaryAnswer, Phases: away},
	})
	byName := func(name string) *Scenario {
		for i := range scenarios {
			if scenarios[i].Name == name {
				return &scenarios[i]
			}
		}
		t.Fatalf("no scenario %q", name)
		return nil
	}
	tests := []struct {
		name     string
		scenario string
		st       Strategy
		want     string
	}{{
		// A backend that drops the provider's headers loses the
		// retry-after: the chain retries after its own 1 s wait.
		name:     "retry_after_ignored",
		scenario: "long-retry-after",
		st:       Strategy{Name: "llmretry", build: mutantLLMRetry(ignoreRetryAfter, false)},
		want:     "early sends",
	}, {
		// The same with the Breaker: without the hint nothing opens it,
		// and every caller retries into the 45 s.
		name:     "retry_after_ignored_breaker",
		scenario: "long-retry-after",
		st:       Strategy{Name: "llmretry + Breaker", Breaker: true, build: mutantLLMRetry(ignoreRetryAfter, true)},
		want:     "early sends",
	}, {
		// A chain that cannot see the caller's deadline waits out a 45 s
		// retry-after past it.
		name:     "deadline_hidden",
		scenario: "long-retry-after",
		st:       Strategy{Name: "llmretry", build: mutantLLMRetry(hideDeadline, false)},
		want:     "parked",
	}, {
		// The same with the Breaker, when both providers send everyone
		// away for 45 s: calls wait on the secondary's breaker, their last,
		// with no deadline to plan by.
		name:     "deadline_hidden_breaker",
		scenario: "both-away",
		st:       Strategy{Name: "llmretry + Breaker", Breaker: true, build: mutantLLMRetry(hideDeadline, true)},
		want:     "parked",
	}, {
		// Plain llmretry, checked as if it were the Breaker row, answers
		// fewer than backoff (time only) when failover overloads the
		// secondary.
		name:     "fewer_answered",
		scenario: "failover-overload",
		st:       Strategy{Name: "llmretry", Breaker: true, build: buildLLMRetry(false)},
		want:     "fewer than",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := byName(tc.scenario)
			var results []*Result
			for _, st := range append([]Strategy{tc.st}, peers()...) {
				results = append(results, playOne(t, sc, st, testSeed))
			}
			broken := strings.Join(invariants(results), "\n")
			if !strings.Contains(broken, tc.want) {
				t.Errorf("invariants() = %q, want a line with %q", broken, tc.want)
			}
			// The same scenario with the chain as published passes: the
			// break, not the scenario, is what the check caught.
			results[0] = playOne(t, sc, Strategy{Name: tc.st.Name, Breaker: tc.st.Breaker, build: buildLLMRetry(tc.st.Breaker)}, testSeed)
			if broken := strings.Join(invariants(results), "\n"); strings.Contains(broken, tc.want) {
				t.Errorf("unbroken: invariants() = %q, want no line with %q", broken, tc.want)
			}
		})
	}
}

// peers returns the strategies llmretry is compared with.
func peers() []Strategy {
	var ps []Strategy
	for _, st := range Strategies() {
		if st.Peer {
			ps = append(ps, st)
		}
	}
	return ps
}

// The ways TestChecksCanFail breaks llmretry's set-up.
const (
	ignoreRetryAfter = iota
	hideDeadline
)

// mutantLLMRetry is buildLLMRetry's chain, with or without breakers,
// broken one way.
func mutantLLMRetry(how int, breakers bool) func(e *Env) doFunc {
	return func(e *Env) doFunc {
		do := buildLLMRetry(breakers)(e)
		switch how {
		case ignoreRetryAfter:
			for i := range e.transports {
				e.transports[i] = dropHeaders{e.transports[i]}
			}
			do = buildLLMRetry(breakers)(e)
		case hideDeadline:
			inner := do
			do = func(ctx context.Context, id int) (int, error) {
				// Cancelled at the deadline, but with no deadline to plan by.
				blind, cancel := context.WithCancel(context.WithoutCancel(ctx))
				defer cancel()
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
				return inner(blind, id)
			}
		}
		return do
	}
}

// dropHeaders is a transport that loses the response's Retry-After.
type dropHeaders struct{ next http.RoundTripper }

func (d dropHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(req)
	if resp != nil {
		resp.Header.Del("Retry-After")
	}
	return resp, err
}

// TestWriteReport writes results/outage.md and one SVG per scenario from
// the test seed's play, and the same report into BENCHMARKS.md between
// its markers, when run with -update:
//
//	cd bench && go test ./outage -run TestWriteReport -update
func TestWriteReport(t *testing.T) {
	if !*update {
		t.Skip("run with -update to write the report")
	}
	scenarios := Scenarios()
	results := publishedResults(t)
	dir := "results"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	svg := func(i int) string { return fmt.Sprintf("%d-%s.svg", i+1, scenarios[i].Name) }
	for i := range scenarios {
		var b bytes.Buffer
		if err := WriteSVG(&b, i+1, &scenarios[i], results[i]); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, svg(i)), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The rate-limit scenario once more, for the Breaker without and with
	// pacing alone: BENCHMARKS.md links it from its paragraph on pacing.
	for i := range scenarios {
		if scenarios[i].Name != "rate-limit" {
			continue
		}
		var b bytes.Buffer
		if err := WritePacingSVG(&b, &scenarios[i], results[i]); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pacingSVG), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if err := Report(&b, testSeed, scenarios, results, svg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "outage.md"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Stdout.Write(b.Bytes())

	// BENCHMARKS.md, at the repository's root, shows the same report one
	// heading level down, with the pictures' paths from the root.
	b.Reset()
	fromRoot := func(i int) string { return "bench/outage/results/" + svg(i) }
	if err := Report(&b, testSeed, scenarios, results, fromRoot); err != nil {
		t.Fatal(err)
	}
	if err := spliceReport(benchmarksMD, demote(b.String())); err != nil {
		t.Fatal(err)
	}
}

// pacingSVG is the picture of rate-limit with and without pacing, in
// results/.
const pacingSVG = "pacing-rate-limit.svg"

// benchmarksMD is the repository's BENCHMARKS.md, from this package.
const benchmarksMD = "../../BENCHMARKS.md"

// The markers in BENCHMARKS.md between which TestWriteReport writes the
// report.
const (
	reportBegin = "<!-- begin outage report: written by `cd bench && go test ./outage -run TestWriteReport -update`; do not edit by hand -->\n"
	reportEnd   = "<!-- end outage report -->\n"
)

// spliceReport replaces what lies between the markers in the file at
// path with report.
func spliceReport(path, report string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	before, rest, ok := strings.Cut(string(old), reportBegin)
	if !ok {
		return fmt.Errorf("%s: no line %q", path, strings.TrimSpace(reportBegin))
	}
	_, after, ok := strings.Cut(rest, reportEnd)
	if !ok {
		return fmt.Errorf("%s: no line %q after the first marker", path, strings.TrimSpace(reportEnd))
	}
	return os.WriteFile(path, []byte(before+reportBegin+"\n"+report+reportEnd+after), 0o644)
}

// demote moves every Markdown heading of report one level down.
func demote(report string) string {
	lines := strings.SplitAfter(report, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			lines[i] = "#" + l
		}
	}
	return strings.Join(lines, "")
}
