package outage

import (
	"strings"
	"testing"
	"time"
)

// TestInvariantsTimeToAnyOutcome checks the rule on hand-made rows, so
// that it is seen to fail whatever the chain of this build does: a
// Breaker row may not take longer to any outcome, at p95, than the same
// chain without it.
func TestInvariantsTimeToAnyOutcome(t *testing.T) {
	row := func(name string, peer, breaker bool, done time.Duration) *Result {
		return &Result{Strategy: name, Peer: peer, Breaker: breaker, Requests: 10, Answered: 9, P95Done: done}
	}
	tests := []struct {
		name    string
		results []*Result
		want    string // a line invariants must return; empty: none about the time to any outcome
	}{{
		name: "breaker_later",
		results: []*Result{
			row(nameLLMRetry, false, false, 20500*time.Millisecond),
			row(nameBreaker, false, true, 288900*time.Millisecond),
		},
		want: "llmretry + Breaker: p95 to any outcome 288.9 s, later than llmretry's 20.5 s",
	}, {
		name: "breaker_as_soon",
		results: []*Result{
			row(nameLLMRetry, false, false, 20*time.Second),
			row(nameBreaker, false, true, 20*time.Second),
		},
	}, {
		name: "breaker_sooner",
		results: []*Result{
			row(nameLLMRetry, false, false, 63*time.Second),
			row(nameBreaker, false, true, 3*time.Second),
		},
	}, {
		// A peer is no measure of this rule: only the same chain is.
		name: "peer_sooner",
		results: []*Result{
			row(nameLLMRetry, false, false, 20*time.Second),
			row(nameBreaker, false, true, 10*time.Second),
			row(nameOpenAI, true, false, 6*time.Second),
		},
	}, {
		name: "no_row_without_breaker",
		results: []*Result{
			row(nameBreaker, false, true, 300*time.Second),
			row(nameOpenAI, true, false, 6*time.Second),
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, line := range invariants(tc.results) {
				if strings.Contains(line, "to any outcome") {
					got = append(got, line)
				}
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("invariants() = %q, want no line about the time to any outcome", got)
			case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
				t.Errorf("invariants() = %q, want [%q]", got, tc.want)
			}
		})
	}
}
