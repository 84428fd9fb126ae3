package batch_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// A new user's batch: the primary hard down, the fallback refusing some
// items and truncating others. With the Breaker the docs recommend, the
// run must end no later than without one: an item the fallback cannot
// answer must not be parked behind the dead primary's breaker (it was:
// 30s a probe, holding its slot, for each such item).
func TestBreakerDoesNotSlowABatchOnADeadPrimary(t *testing.T) {
	run := func(t *testing.T, breakers bool) (took time.Duration, counts batch.Counts) {
		synctest.Test(t, func(t *testing.T) {
			primary := func(ctx context.Context, id string) (string, error) {
				time.Sleep(500 * time.Millisecond)
				return "", overloaded
			}
			fallback := func(ctx context.Context, id string) (string, error) {
				time.Sleep(time.Second)
				n, _ := strconv.Atoi(id)
				switch n % 10 {
				case 3:
					return "", refused
				case 7:
					return "", cut
				}
				return "answer " + id, nil
			}
			policy := llmretry.Policy{Waits: []time.Duration{200 * time.Millisecond, 500 * time.Millisecond}}
			chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
				{Model: "primary", Call: primary, Retry: policy},
				{Model: "fallback", Call: fallback, Retry: policy},
			}}
			if breakers {
				for i := range chain.Backends {
					chain.Backends[i].Breaker = &llmretry.Breaker{}
				}
			}
			r := &batch.Runner[string, string]{
				Chain:       chain,
				Concurrency: 16,
				OnResult:    func(batch.Item[string], string) {},
				Dead:        batch.SinkFunc(func(batch.DeadLetter) error { return nil }),
			}
			ids := make([]batch.Item[string], 2000)
			for i := range ids {
				ids[i] = batch.Item[string]{ID: strconv.Itoa(i), Req: strconv.Itoa(i)}
			}
			start := time.Now()
			var err error
			counts, err = r.Run(context.Background(), slices.Values(ids))
			if err != nil {
				t.Fatalf("Run() = %v", err)
			}
			took = time.Since(start)
		})
		return took, counts
	}
	without, wantCounts := run(t, false)
	with, counts := run(t, true)
	// Breakers send fewer requests, so the usage differs by design.
	counts.Usage, wantCounts.Usage = llmretry.Usage{}, llmretry.Usage{}
	if counts != wantCounts {
		t.Errorf("Run() with breakers counts = %+v, want %+v as without", counts, wantCounts)
	}
	if with > without {
		t.Errorf("Run() with breakers took %v, want no longer than the %v it takes without", with, without)
	}
	t.Logf("2,000 items: %v without breakers, %v with", without, with)
}
