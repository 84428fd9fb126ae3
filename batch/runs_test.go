package batch_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// A run in which the breaker skipped every backend sent nothing: it does
// not use up one of the item's runs, and the item runs again when the
// breaker lets a probe through. Here the breaker is open until 5s, and
// the item has a single run: it is sent at 5s and succeeds, instead of
// going to the dead letters having sent nothing.
func TestSkipOnlyRunIsNotCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(0, map[string][]error{"opener": {overloaded}})
		chain := f.chain()
		chain.Backends[0].Breaker = &llmretry.Breaker{Failures: 1, Cooldown: 5 * time.Second}
		// A call outside the batch opens the breaker at 0 for 5s.
		if _, err := chain.Do(context.Background(), "opener"); err == nil {
			t.Fatal("Do(opener) = nil error, want the 503 that opens the breaker")
		}
		var rec record
		r := rec.runner(chain)
		r.Runs = 1
		counts, err := r.Run(context.Background(), items("x"))
		if err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}
		// The opener's call is not the batch's: the batch billed one.
		if want := (batch.Counts{Succeeded: 1, Usage: billed(1)}); counts != want {
			t.Errorf("Run() counts = %+v, want %+v; dead letters %+v", counts, want, rec.dead)
		}
		if diff := cmp.Diff([]time.Duration{5 * time.Second}, f.runs["x"]); diff != "" {
			t.Errorf("run times of x (-want +got):\n%s", diff)
		}
	})
}

// Through an outage longer than the breaker's cooldown, an item's runs
// are spent only on runs that sent a request: every dead letter's Runs is
// the requests its item sent, and each run it keeps sent one. Runs of
// skips only wait for the breaker (whose probe may be in flight, which
// gives no time to wait for: then the runner's own wait).
func TestDeadLettersSentEveryRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		f := newFake(100*time.Millisecond, nil)
		chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
			Model:   "m",
			Breaker: &llmretry.Breaker{Failures: 1, Cooldown: 3 * time.Second},
			Call: func(ctx context.Context, id string) (string, error) {
				resp, err := f.call(ctx, id)
				if time.Since(start) < time.Minute {
					return "", overloaded // down for the first minute
				}
				return resp, err
			},
		}}}
		var rec record
		r := rec.runner(chain)
		r.Concurrency = 4
		r.Runs = 3
		r.Waits = []time.Duration{time.Second}
		counts, err := r.Run(context.Background(), items(numbered(10)...))
		if err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}
		// The outage fails the 4 first requests, then a probe every 3.1s:
		// 23 failed requests in all, more than the 10 items can take two
		// at a time and fewer than three at a time, so some items spend
		// their three runs and some do not.
		if counts.Total() != 10 || counts.NotRun != 0 || counts.Dead == 0 || counts.Succeeded == 0 {
			t.Errorf("Run() counts = %+v, want 10 ended, some dead, some succeeded, none not run", counts)
		}
		failed := 0
		for _, runs := range f.runs {
			for _, at := range runs {
				if at < time.Minute {
					failed++
				}
			}
		}
		if failed != 23 {
			t.Errorf("%d requests failed in the outage, want 23", failed)
		}
		for id, d := range rec.dead {
			if sent := len(f.runs[id]); d.Why != batch.WhyRunsUsed || d.Runs != 3 || sent != d.Runs {
				t.Errorf("dead letter of %s: why %s after %d runs, %d requests sent; want runs_used after 3 runs, each of which sent one", id, d.Why, d.Runs, sent)
			}
			for i, err := range append(d.Earlier, d.Err) {
				if sentNothing(err) {
					t.Errorf("dead letter of %s: run %d sent nothing: %v", id, i+1, err)
				}
			}
		}
		for id := range rec.results {
			if sent := len(f.runs[id]); sent > 3 {
				t.Errorf("item %s succeeded after %d requests, want at most 3 (Runs)", id, sent)
			}
		}
	})
}

// sentNothing reports whether err's records are all skips.
func sentNothing(err error) bool {
	var e *llmretry.Exhausted
	if !errors.As(err, &e) || len(e.Attempts) == 0 {
		return false
	}
	for _, a := range e.Attempts {
		if !a.Skipped {
			return false
		}
	}
	return true
}

// Run holds no concurrency slot while its iterator blocks: with one slot,
// an item advised to run again after 1s runs again after 1s, while the
// iterator takes an hour to yield the next item.
func TestBlockedIteratorHoldsNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(0, map[string][]error{"a": {limited(time.Second), nil}})
		var rec record
		r := rec.runner(f.chain())
		r.Concurrency = 1
		seq := func(yield func(batch.Item[string]) bool) {
			if !yield(batch.Item[string]{ID: "a", Req: "a"}) {
				return
			}
			time.Sleep(time.Hour) // a slow source: a queue with nothing in it yet
			yield(batch.Item[string]{ID: "b", Req: "b"})
		}
		counts, err := r.Run(context.Background(), seq)
		if err != nil || counts.Succeeded != 2 {
			t.Fatalf("Run() = %+v, %v, want 2 succeeded, nil", counts, err)
		}
		want := map[string][]time.Duration{"a": {0, time.Second}, "b": {time.Hour}}
		if diff := cmp.Diff(want, f.runs); diff != "" {
			t.Errorf("run times (-want +got):\n%s", diff)
		}
	})
}

// Two Runs of one Runner at once still call its Sink's Put, and its
// other callbacks, one at a time: each Run's item ends in a callback that
// holds on until the test lets it go, and only one may be inside.
func TestConcurrentRunsSerialiseCallbacks(t *testing.T) {
	for _, id := range []string{"dead", "ok"} {
		t.Run(id, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFake(0, map[string][]error{"dead": {cut}})
				release := make(chan struct{})
				var inside, most, calls atomic.Int64
				// hold is a callback that counts the callbacks inside at
				// once, and holds on until release.
				hold := func() {
					calls.Add(1)
					n := inside.Add(1)
					if n > most.Load() {
						most.Store(n)
					}
					<-release
					inside.Add(-1)
				}
				r := &batch.Runner[string, string]{
					Chain:    f.chain(),
					Dead:     batch.SinkFunc(func(batch.DeadLetter) error { hold(); return nil }),
					OnResult: func(batch.Item[string], string) { hold() },
				}
				var wg sync.WaitGroup
				for range 2 {
					wg.Go(func() {
						if counts, err := r.Run(context.Background(), items(id)); err != nil || counts.Total() != 1 {
							t.Errorf("Run() = %+v, %v, want 1 ended, nil", counts, err)
						}
					})
				}
				synctest.Wait() // both Runs have reached their callback, or wait for it
				got := most.Load()
				close(release)
				wg.Wait()
				if got != 1 || calls.Load() != 2 {
					t.Errorf("%d callbacks at once, %d in all; want 1 at a time, 2 in all", got, calls.Load())
				}
			})
		})
	}
}

// One Runner may run batches one after another in different synctest
// bubbles (a table of tests sharing a Runner): nothing of one Run's
// bubble is kept for the next.
func TestRunnerInTwoBubbles(t *testing.T) {
	f := newFake(0, map[string][]error{"dead": {cut}})
	r := &batch.Runner[string, string]{
		Chain: f.chain(),
		Dead:  batch.SinkFunc(func(batch.DeadLetter) error { return nil }),
	}
	for range 2 {
		synctest.Test(t, func(t *testing.T) {
			if counts, err := r.Run(context.Background(), items("dead", "ok")); err != nil || counts.Dead != 1 || counts.Succeeded != 1 {
				t.Errorf("Run() = %+v, %v, want 1 dead, 1 succeeded, nil", counts, err)
			}
		})
	}
}
