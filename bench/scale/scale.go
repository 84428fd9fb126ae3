// Package scale measures how the cost of a [llmretry.Breaker] grows with
// the calls in flight through it and the calls waiting for it, and how
// many store calls a Breaker with a Store makes per waiting call.
//
// Each figure is one run of a scripted load inside a testing/synctest
// bubble: the backends' latencies and the callers' waits are timers on
// the bubble's clock, so a run of thousands of calls over minutes of
// virtual time takes only the CPU its decisions cost. That CPU (user and
// system time of the process, GC included) is the figure; the same load
// without a Breaker is the floor. The store figures are counts, exact
// for a given load.
//
// The loads:
//
//   - InFlight: n calls arrive within a second and each holds its
//     request for 20 s, so that all n are in flight at once, then
//     answers, reporting rate-limit headers with room to spare (the
//     Breaker has had one report before, so it paces). The floor is the
//     same chain without a Breaker.
//   - DrainClosing: a backend whose breaker five failures opened; n calls
//     come to it as their last backend within a second and wait; at the
//     cooldown's end the first probes, the answer closes the breaker and
//     the others go, one millisecond apart.
//   - DrainPaced: a backend behind a bucket of 100 requests a second that
//     reports its headers; n calls arrive at once, after a call that
//     emptied the bucket, and go as the bucket refills, paced by the
//     reports.
//   - StoreWaiting: DrainPaced over four processes, each a Breaker of its
//     own sharing one in-memory store at 1 ms a call; the figure is the
//     store's loads per waiting call.
package scale

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// Result is what one run of a load measured.
type Result struct {
	Load     string
	Calls    int
	CPU      time.Duration // user and system time of the process during the run
	Answered int           // calls that got an answer
	Refused  int           // requests the backend's bucket refused (429s)
	Loads    int64         // store loads, for StoreWaiting
	Swaps    int64         // store compare-and-swaps, for StoreWaiting
	Sent     int64         // requests the backends got
}

// cpu is the process's CPU time so far.
func cpu() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// minCalls is how many calls run measures at the least, over as many
// plays of a load as that takes.
const minCalls = 20000

// run measures fn, run in a bubble of its own, and reports the CPU of one
// play. It plays a small load as many times as minCalls calls take, and
// divides: a single play of 250 calls takes a few milliseconds, within
// the noise of the process's own work (a collection, the stacks grown
// for a new size), and the growth from the smallest size would then say
// more of that noise than of the load.
func run(t *testing.T, load string, n int, fn func(r *Result)) Result {
	r := Result{Load: load, Calls: n}
	plays := max(1, minCalls/n)
	start := cpu()
	for range plays {
		synctest.Test(t, func(*testing.T) { fn(&r) })
	}
	r.CPU = (cpu() - start) / time.Duration(plays)
	return r
}

// bucket is a provider's requests bucket: Limit requests, refilled
// steadily over Refill, full at the start. It answers as a provider
// does, with OpenAI's rate-limit headers.
type bucket struct {
	mu     sync.Mutex
	limit  int64
	refill time.Duration // from empty to full
	level  float64
	at     time.Time
}

func newBucket(limit int64, refill time.Duration) *bucket {
	return &bucket{limit: limit, refill: refill, level: float64(limit), at: time.Now()}
}

// take takes one request if the bucket holds one, and returns the
// headers of the answer.
func (b *bucket) take() (http.Header, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.level = min(float64(b.limit), b.level+float64(now.Sub(b.at))*float64(b.limit)/float64(b.refill))
	b.at = now
	ok := b.level >= 1
	if ok {
		b.level--
	}
	toFull := time.Duration((float64(b.limit) - b.level) * float64(b.refill) / float64(b.limit))
	toFull = (toFull + time.Millisecond - 1).Truncate(time.Millisecond)
	h := http.Header{}
	h.Set("X-Ratelimit-Limit-Requests", strconv.FormatInt(b.limit, 10))
	h.Set("X-Ratelimit-Remaining-Requests", strconv.FormatInt(int64(b.level), 10))
	h.Set("X-Ratelimit-Reset-Requests", toFull.String())
	if !ok {
		h.Set("Retry-After", "1")
	}
	return h, ok
}

// roomy is the header of a provider with room to spare.
var roomy = http.Header{
	"X-Ratelimit-Limit-Requests":     {"1000000"},
	"X-Ratelimit-Remaining-Requests": {"999999"},
	"X-Ratelimit-Reset-Requests":     {"60ms"},
}

// InFlight is the load of n calls in flight at once, through a Breaker
// when breaker is set.
func InFlight(t *testing.T, n int, breaker bool) Result {
	name := "in flight, no Breaker"
	if breaker {
		name = "in flight, Breaker"
	}
	return run(t, name, n, func(r *Result) {
		var answered, sent atomic.Int64
		b := llmretry.Backend[int, string]{
			Model: "m",
			Call: func(ctx context.Context, _ int) (string, error) {
				sent.Add(1)
				time.Sleep(20 * time.Second)
				llmretry.ReportLimits(ctx, roomy)
				return "ok", nil
			},
		}
		if breaker {
			b.Breaker = &llmretry.Breaker{}
		}
		chain := &llmretry.Chain[int, string]{Backends: []llmretry.Backend[int, string]{b}}
		chain.Do(context.Background(), -1) // the report pacing starts from
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Second / time.Duration(n))
				if _, err := chain.Do(context.Background(), i); err == nil {
					answered.Add(1)
				}
			})
		}
		wg.Wait()
		r.Answered, r.Sent = int(answered.Load()), sent.Load()
	})
}

// DrainClosing is the load of n calls waiting for a breaker to close.
func DrainClosing(t *testing.T, n int) Result {
	return run(t, "drain, closing", n, func(r *Result) {
		var answered, sent atomic.Int64
		down := true
		br := &llmretry.Breaker{Cooldown: 10 * time.Second}
		chain := &llmretry.Chain[int, string]{Backends: []llmretry.Backend[int, string]{{
			Model: "m",
			Call: func(ctx context.Context, _ int) (string, error) {
				sent.Add(1)
				if down {
					return "", llmretry.StatusFailure(http.StatusServiceUnavailable, nil, nil)
				}
				time.Sleep(100 * time.Millisecond)
				return "ok", nil
			},
			Retry:   llmretry.Policy{Waits: []time.Duration{time.Minute, time.Minute}},
			Breaker: br,
		}}}
		for range 5 {
			chain.Do(context.Background(), -1) // opens it: 5 failures
		}
		down = false
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Second / time.Duration(n))
				if _, err := chain.Do(context.Background(), i); err == nil {
					answered.Add(1)
				}
			})
		}
		wg.Wait()
		r.Answered, r.Sent = int(answered.Load()), sent.Load()
	})
}

// DrainPaced is the load of n calls waiting for a bucket to refill.
func DrainPaced(t *testing.T, n int) Result {
	return run(t, "drain, paced", n, func(r *Result) {
		res := pacedDrain(n, 1, 0)
		r.Answered, r.Refused, r.Sent = res.Answered, res.Refused, res.Sent
	})
}

// StoreWaiting is DrainPaced over four processes sharing a store.
func StoreWaiting(t *testing.T, n int) Result {
	return run(t, "store, paced, 4 processes", n, func(r *Result) {
		*r = pacedDrain(n, 4, time.Millisecond)
		r.Load, r.Calls = "store, paced, 4 processes", n
	})
}

// StoreClosing is DrainClosing over four processes sharing a store at
// 1 ms a call; the figure is the store's loads per waiting call.
func StoreClosing(t *testing.T, n int) Result {
	return run(t, "store, closing, 4 processes", n, func(r *Result) {
		var answered, sent atomic.Int64
		var down atomic.Bool
		down.Store(true)
		// Notices without the state: the loads are what waking costs.
		store := &llmretrytest.MemoryStore{Latency: time.Millisecond, StatelessNotices: true}
		call := func(ctx context.Context, _ int) (string, error) {
			sent.Add(1)
			if down.Load() {
				return "", llmretry.StatusFailure(http.StatusServiceUnavailable, nil, nil)
			}
			time.Sleep(100 * time.Millisecond)
			return "ok", nil
		}
		chains := make([]*llmretry.Chain[int, string], 4)
		for p := range chains {
			chains[p] = &llmretry.Chain[int, string]{Backends: []llmretry.Backend[int, string]{{
				Model: "m", Call: call,
				Retry:   llmretry.Policy{Waits: []time.Duration{time.Minute, time.Minute}},
				Breaker: &llmretry.Breaker{Cooldown: 10 * time.Second, Store: store, Key: "m"},
			}}}
		}
		for range 5 {
			chains[0].Do(context.Background(), -1) // opens it for the fleet
		}
		down.Store(false)
		before := store.Calls()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Second / time.Duration(n))
				if _, err := chains[i%4].Do(context.Background(), i); err == nil {
					answered.Add(1)
				}
			})
		}
		wg.Wait()
		c := store.Calls()
		r.Answered, r.Sent = int(answered.Load()), sent.Load()
		r.Loads, r.Swaps = c.Loads-before.Loads, c.Swaps-before.Swaps
	})
}

// pacedDrain plays n calls over procs processes (each with a Breaker of
// its own, sharing a store of the given latency when procs > 1) against
// a bucket of 100 requests a second.
func pacedDrain(n, procs int, latency time.Duration) Result {
	var (
		answered, sent, refused atomic.Int64
		bk                      = newBucket(100, time.Second)
		store                   *llmretrytest.MemoryStore
	)
	if procs > 1 {
		// Notices without the state: the loads are what waking costs
		// (with notices that carry it, a waiting call loads nothing).
		store = &llmretrytest.MemoryStore{Latency: latency, StatelessNotices: true}
	}
	call := func(ctx context.Context, _ int) (string, error) {
		sent.Add(1)
		h, ok := bk.take()
		time.Sleep(200 * time.Millisecond)
		if !ok {
			refused.Add(1)
			return "", llmretry.StatusFailure(http.StatusTooManyRequests, h, nil)
		}
		llmretry.ReportLimits(ctx, h)
		return "ok", nil
	}
	chains := make([]*llmretry.Chain[int, string], procs)
	for p := range chains {
		br := &llmretry.Breaker{}
		if store != nil {
			br.Store, br.Key = store, "m"
		}
		chains[p] = &llmretry.Chain[int, string]{Backends: []llmretry.Backend[int, string]{{
			Model: "m", Call: call, Breaker: br,
			Retry: llmretry.Policy{Waits: []time.Duration{time.Second}},
		}}}
	}
	// Empty the bucket, so that every call of the load waits.
	for range 100 {
		chains[0].Do(context.Background(), -1)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * time.Millisecond / 10) // in caller order, all within n/10 ms
			if _, err := chains[i%procs].Do(context.Background(), i); err == nil {
				answered.Add(1)
			}
		})
	}
	before := llmretrytest.StoreCalls{}
	if store != nil {
		before = store.Calls()
	}
	wg.Wait()
	r := Result{Answered: int(answered.Load()), Refused: int(refused.Load()), Sent: sent.Load()}
	if store != nil {
		c := store.Calls()
		r.Loads, r.Swaps = c.Loads-before.Loads, c.Swaps-before.Swaps
	}
	return r
}

// String is one line of a table.
func (r Result) String() string {
	s := fmt.Sprintf("%-28s %6d calls  %9.3f s CPU  answered %d", r.Load, r.Calls, r.CPU.Seconds(), r.Answered)
	if r.Refused > 0 {
		s += fmt.Sprintf("  refused %d", r.Refused)
	}
	if r.Loads > 0 || r.Swaps > 0 {
		s += fmt.Sprintf("  loads/call %.2f  swaps/call %.2f", float64(r.Loads)/float64(r.Calls), float64(r.Swaps)/float64(r.Calls))
	}
	return s
}
