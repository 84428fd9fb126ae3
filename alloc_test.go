package llmretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/llmretry/llmretry"
)

// TestDoFailureAllocations guards the allocations of the failure paths,
// with zero waits so no timer is involved: one per attempt for its
// context, the records' slice as it grows, and the error.
func TestDoFailureAllocations(t *testing.T) {
	transient := llmretry.StatusFailure(503, nil, nil) // allocated once, as a real backend's would not be
	rejected := llmretry.StatusFailure(400, nil, nil)
	zeroWaits := llmretry.Policy{Waits: make([]time.Duration, 2)}

	// failing returns a backend that fails its first n calls of each Do
	// (all of them when n < 0) with err.
	type counter struct{ n int }
	failing := func(c *counter, n int, err error) func(context.Context, string) (string, error) {
		return func(context.Context, string) (string, error) {
			c.n++
			if n < 0 || c.n <= n {
				return "", err
			}
			return "ok", nil
		}
	}

	tests := []struct {
		name      string
		backends  func(c *counter) []backend
		wantErr   bool
		maxAllocs float64
	}{
		{
			name: "two_failures",
			backends: func(c *counter) []backend {
				return []backend{{Model: "a", Call: failing(c, 2, transient), Retry: zeroWaits}}
			},
			maxAllocs: 3 + 2, // three attempts, and two records
		},
		{
			name: "failover",
			backends: func(c *counter) []backend {
				return []backend{
					{Model: "a", Call: failing(c, 1, rejected), Retry: zeroWaits},
					{Model: "b", Call: failing(c, 2, rejected), Retry: zeroWaits},
					{Model: "c", Call: failing(c, 0, nil), Retry: zeroWaits},
				}
			},
			maxAllocs: 3 + 2, // three attempts, and two records
		},
		{
			name: "exhausted",
			backends: func(c *counter) []backend {
				return []backend{
					{Model: "a", Call: failing(c, -1, transient), Retry: zeroWaits},
					{Model: "b", Call: failing(c, -1, transient), Retry: zeroWaits},
					{Model: "c", Call: failing(c, -1, transient), Retry: zeroWaits},
				}
			},
			wantErr:   true,
			maxAllocs: 9 + 5 + 1, // nine attempts, the records grown five times, and the error
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cnt := new(counter)
			c := &chain{Backends: tc.backends(cnt)}
			ctx := context.Background()
			allocs := testing.AllocsPerRun(100, func() {
				cnt.n = 0
				if _, err := c.Do(ctx, "hi"); (err != nil) != tc.wantErr {
					t.Fatalf("Do() error = %v, want error: %t", err, tc.wantErr)
				}
			})
			if allocs > tc.maxAllocs {
				t.Errorf("Do() made %v allocations, want at most %v", allocs, tc.maxAllocs)
			}
		})
	}
}

// TestDoSuccessAllocationsUnderDeadline: under a deadline too, the success
// path allocates once, the attempt's context (TestDoSuccessAllocations has
// it without one).
func TestDoSuccessAllocationsUnderDeadline(t *testing.T) {
	ok := func(context.Context, string) (string, error) { return "ok", nil }
	c := &chain{Backends: []backend{{Model: "a", Call: ok, Retry: llmretry.Policy{Waits: []time.Duration{time.Second}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := c.Do(ctx, "hi"); err != nil {
			t.Fatalf("Do() error = %v, want nil", err)
		}
	})
	if allocs > 1 {
		t.Errorf("Do() made %v allocations, want at most 1", allocs)
	}
}

// ReportLimits, which every adapter calls with every response, allocates
// at most twice, with a Breaker or without.
func TestReportLimitsAllocations(t *testing.T) {
	openai := http.Header{}
	openai.Set("X-Ratelimit-Limit-Requests", "500")
	openai.Set("X-Ratelimit-Remaining-Requests", "499")
	openai.Set("X-Ratelimit-Reset-Requests", "120ms")
	openai.Set("X-Ratelimit-Limit-Tokens", "30000")
	openai.Set("X-Ratelimit-Remaining-Tokens", "29000")
	openai.Set("X-Ratelimit-Reset-Tokens", "2s")
	anthropic := http.Header{}
	for _, b := range []string{"requests", "tokens", "input-tokens", "output-tokens"} {
		anthropic.Set("anthropic-ratelimit-"+b+"-limit", "1000")
		anthropic.Set("anthropic-ratelimit-"+b+"-remaining", "999")
		anthropic.Set("anthropic-ratelimit-"+b+"-reset", "2026-12-02T04:30:01Z")
	}
	anthropic.Set("Retry-After", "3")
	for _, br := range []*llmretry.Breaker{nil, {}} {
		for name, h := range map[string]http.Header{"openai": openai, "anthropic": anthropic} {
			var allocs float64
			call := func(ctx context.Context, _ string) (string, error) {
				allocs = testing.AllocsPerRun(100, func() { llmretry.ReportLimits(ctx, h) })
				return "ok", nil
			}
			c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
			if _, err := c.Do(context.Background(), "r"); err != nil {
				t.Fatal(err)
			}
			if allocs > 2 {
				t.Errorf("ReportLimits(%s headers, breaker %v) allocates %v times, want at most 2", name, br != nil, allocs)
			}
		}
	}
}
