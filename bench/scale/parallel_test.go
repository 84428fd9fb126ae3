package scale

import (
	"context"
	"net/http"
	"testing"

	"github.com/llmretry/llmretry"
)

// BenchmarkParallel runs Do from 64 goroutines at once (32 per CPU on
// two) on one backend that answers at once: without a Breaker (the
// floor), through one closed Breaker, and through one whose every
// answer reports rate limits with room to spare, so that it paces.
func BenchmarkParallel(b *testing.B) {
	h := http.Header{
		"X-Ratelimit-Limit-Requests":     {"1000000000"},
		"X-Ratelimit-Remaining-Requests": {"999999999"},
		"X-Ratelimit-Reset-Requests":     {"1ms"},
	}
	for _, tc := range []struct {
		name    string
		breaker bool
		report  bool
	}{
		{"plain", false, false},
		{"breaker", true, false},
		{"breaker_reporting", true, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			call := func(ctx context.Context, _ int) (string, error) {
				if tc.report {
					llmretry.ReportLimits(ctx, h)
				}
				return "ok", nil
			}
			backend := llmretry.Backend[int, string]{Model: "m", Call: call}
			if tc.breaker {
				backend.Breaker = &llmretry.Breaker{}
			}
			chain := &llmretry.Chain[int, string]{Backends: []llmretry.Backend[int, string]{backend}}
			ctx := context.Background()
			b.SetParallelism(32)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := chain.Do(ctx, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
