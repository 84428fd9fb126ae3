package outage

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// WriteMarkdown writes one scenario's results as a Markdown section: a
// heading, the script in one line, and a table with one row per strategy.
func WriteMarkdown(w io.Writer, n int, sc *Scenario, results []*Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "### %d. %s\n\n%s.\n\n", n, sc.Name, sc.About)
	b.WriteString("| strategy | answered | by primary | by secondary | p50 | p95 | p99 | p95 to any outcome | sent | sent/answer | billed/answer | answered 429 | early sends | parked at deadline |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s (%d) | %d | %d | %s | %s | %s | %s | %d | %s | %s | %d | %d | %d |\n",
			r.Strategy, percent(r.Answered, r.Requests), r.Answered, r.ByPrimary, r.BySecond,
			seconds(r.P50), seconds(r.P95), seconds(r.P99), seconds(r.P95Done),
			r.Sent, ratio(r.SentPerAnswer(), r.Answered), ratio(r.BilledPerAnswer(), r.Answered),
			r.Got429, r.Early, r.Parked)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// percent formats n of total as a percentage with one decimal.
func percent(n, total int) string {
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(total))
}

// seconds formats a duration in seconds with one decimal.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// ratio formats a per-answer figure, or "-" when nothing was answered.
func ratio(x float64, answered int) string {
	if answered == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

// Report writes the whole report: how it was made, then for each scenario
// its table, its picture (svgs names the SVG file of scenario i; empty
// leaves pictures out) and where llmretry stands against its targets.
func Report(w io.Writer, seed uint64, scenarios []Scenario, results [][]*Result, svgs func(i int) string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## Outcomes under outage (seed %d)\n\n", seed)
	b.WriteString("Written by `cd bench && go test ./outage -run TestWriteReport -update`: every scenario played in virtual time (testing/synctest) against every strategy; the same seed gives these tables byte for byte.\n\n")
	b.WriteString("Columns: answered within the deadline (all answers when there is none), by which provider; time from arrival to answer (nearest rank, over the answered); p95 time from arrival to the strategy's return, answered or not (over every caller); requests that reached a provider; billed = answers, truncations and generations cut by a timeout; requests answered 429; early sends = requests sent to a provider before the retry-after it gave that caller ran out; parked = callers in a wait, with no request in flight, when their deadline passed.\n\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	for i := range scenarios {
		if err := WriteMarkdown(w, i+1, &scenarios[i], results[i]); err != nil {
			return err
		}
		var s strings.Builder
		if svgs != nil {
			fmt.Fprintf(&s, "![%s: answers and requests sent over time](%s)\n\n", scenarios[i].Name, svgs(i))
		}
		for _, line := range targets(&scenarios[i], results[i]) {
			s.WriteString("- " + line + "\n")
		}
		s.WriteString("\n")
		if _, err := io.WriteString(w, s.String()); err != nil {
			return err
		}
	}
	return nil
}

// invariants returns what llmretry must never do and did in one
// scenario: an early send or a parked caller, with or without the
// Breaker, and, with the Breaker, fewer answers than any peer or a later
// p95 time to any outcome than the same chain without it. The counts are
// exact and the times are on the bubble's clock, the same on every
// replay, so a test can fail on them.
func invariants(results []*Result) []string {
	var broken []string
	plain := withoutBreaker(results)
	for _, r := range results {
		if r.Peer {
			continue
		}
		if r.Early > 0 {
			broken = append(broken, fmt.Sprintf("%s: %d early sends, want 0", r.Strategy, r.Early))
		}
		if r.Parked > 0 {
			broken = append(broken, fmt.Sprintf("%s: %d callers parked at their deadline, want 0", r.Strategy, r.Parked))
		}
		if !r.Breaker {
			continue
		}
		// A breaker is there to spare calls a dead backend; a call it
		// holds longer than the chain would have taken without it, to
		// answer or to give up, is one it made worse.
		if plain != nil && r.P95Done > plain.P95Done {
			broken = append(broken, fmt.Sprintf("%s: p95 to any outcome %s, later than %s's %s", r.Strategy, seconds(r.P95Done), plain.Strategy, seconds(plain.P95Done)))
		}
		for _, p := range results {
			if p.Peer && p.Answered > r.Answered {
				broken = append(broken, fmt.Sprintf("%s: answered %d, fewer than %s's %d", r.Strategy, r.Answered, p.Strategy, p.Answered))
			}
		}
	}
	return broken
}

// pacedInvariants returns what llmretry's paced row must never do and
// did in one scenario: draw a 429 where every 429 comes from a bucket
// (whose every answer said what it held), or answer fewer requests than
// any other row. Its early sends and parked callers are invariants'.
func pacedInvariants(sc *Scenario, results []*Result) []string {
	var broken []string
	for _, r := range results {
		if !r.Paced {
			continue
		}
		if sc.onlyBuckets429() && r.Got429 > 0 {
			broken = append(broken, fmt.Sprintf("%s: %d requests answered 429, want 0: every 429 here comes from a bucket that said what it held", r.Strategy, r.Got429))
		}
		for _, o := range results {
			if o.Answered > r.Answered {
				broken = append(broken, fmt.Sprintf("%s: answered %d, fewer than %s's %d", r.Strategy, r.Answered, o.Strategy, o.Answered))
			}
		}
	}
	return broken
}

// onlyBuckets429 reports whether every 429 of the scenario comes from a
// token bucket: one of its providers has a bucket, and no phase of either
// answers 429 on its own.
func (sc *Scenario) onlyBuckets429() bool {
	bucket := false
	for _, p := range []*Provider{&sc.Primary, &sc.Second} {
		bucket = bucket || p.Rate > 0
		for _, ph := range p.Phases {
			if ph.Status == http.StatusTooManyRequests {
				return false
			}
		}
	}
	return bucket
}

// withoutBreaker returns llmretry's row without the Breaker, nil when
// results have none.
func withoutBreaker(results []*Result) *Result {
	for _, r := range results {
		if !r.Peer && !r.Breaker {
			return r
		}
	}
	return nil
}

// targets says, in one line each, where each of llmretry's rows with its
// Breaker (without and with pacing) stands against the targets in one
// scenario.
func targets(sc *Scenario, results []*Result) []string {
	var lines []string
	mark := func(ok bool, what string) {
		lines = append(lines, markLine(ok, what))
	}
	var brs []*Result
	for _, r := range results {
		switch {
		case r.Breaker:
			brs = append(brs, r)
		case !r.Peer:
			mark(r.Early == 0 && r.Parked == 0, fmt.Sprintf("%s: %d early sends, %d parked at their deadline", r.Strategy, r.Early, r.Parked))
		}
	}
	if brs == nil {
		return append(lines, "not yet measured: the targets of llmretry + Breaker (not in this build)")
	}
	for _, br := range brs {
		lines = append(lines, breakerTargets(sc, br, results)...)
	}
	return lines
}

// markLine is one target's line: met or MISSED, and what.
func markLine(ok bool, what string) string {
	state := "met"
	if !ok {
		state = "MISSED"
	}
	return fmt.Sprintf("%s: %s", state, what)
}

// breakerTargets says where one Breaker row, br, stands against the
// targets in one scenario.
func breakerTargets(sc *Scenario, br *Result, results []*Result) []string {
	var lines []string
	mark := func(ok bool, what string) {
		lines = append(lines, markLine(ok, what))
	}
	var fewer, slower, slowerDone, costlier []string
	asMany := 0 // peers that answered at least as many
	for _, p := range results {
		if !p.Peer {
			continue
		}
		if p.Answered > br.Answered {
			fewer = append(fewer, fmt.Sprintf("%s %d", p.Strategy, p.Answered))
		}
		if p.Answered >= br.Answered && p.Answered > 0 {
			asMany++
			if p.P95 < br.P95 {
				slower = append(slower, fmt.Sprintf("%s %s", p.Strategy, seconds(p.P95)))
			}
			if p.P95Done < br.P95Done {
				slowerDone = append(slowerDone, fmt.Sprintf("%s %s", p.Strategy, seconds(p.P95Done)))
			}
			if p.SentPerAnswer() < br.SentPerAnswer() {
				costlier = append(costlier, fmt.Sprintf("%s %.2f", p.Strategy, p.SentPerAnswer()))
			}
		}
	}
	mark(len(fewer) == 0, fmt.Sprintf("%s: answered %d ≥ every peer's%s", br.Strategy, br.Answered, against(fewer)))
	if plain := withoutBreaker(results); plain != nil {
		mark(br.P95Done <= plain.P95Done, fmt.Sprintf("%s: p95 to any outcome %s ≤ %s's %s", br.Strategy, seconds(br.P95Done), plain.Strategy, seconds(plain.P95Done)))
	}
	if asMany == 0 {
		lines = append(lines, fmt.Sprintf("met: %s: p95 %s, p95 to any outcome %s and sent per answer %.2f (no peer answered as many)", br.Strategy, seconds(br.P95), seconds(br.P95Done), br.SentPerAnswer()))
	} else {
		mark(len(slower) == 0, fmt.Sprintf("%s: p95 %s ≤ that of every peer that answered as many%s", br.Strategy, seconds(br.P95), against(slower)))
		mark(len(slowerDone) == 0, fmt.Sprintf("%s: p95 to any outcome %s ≤ that of every peer that answered as many%s", br.Strategy, seconds(br.P95Done), against(slowerDone)))
		mark(len(costlier) == 0, fmt.Sprintf("%s: sent per answer %.2f ≤ that of every peer that answered as many%s", br.Strategy, br.SentPerAnswer(), against(costlier)))
	}
	mark(br.Early == 0 && br.Parked == 0, fmt.Sprintf("%s: %d early sends, %d parked at their deadline", br.Strategy, br.Early, br.Parked))
	if sc.Name == "rate-limit" {
		best := -1
		for _, p := range results {
			if p.Peer && (best < 0 || p.Got429 < best) {
				best = p.Got429
			}
		}
		mark(2*br.Got429 <= best, fmt.Sprintf("%s: %d requests answered 429, at most half the best peer's %d", br.Strategy, br.Got429, best))
	}
	return lines
}

// against lists the peers a target was missed against.
func against(peers []string) string {
	if len(peers) == 0 {
		return ""
	}
	return " (against " + strings.Join(peers, ", ") + ")"
}
