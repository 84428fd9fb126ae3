package llmretry_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The tests in this file hold the Breaker to what it must do however
// many calls use it and however its store behaves: every time-based
// rule wakes the call it concerns, MaxWait caps every report, and a store
// that is slow, contended or failing costs no call its deadline and
// keeps no request in flight that is not.

// A call held back by a report that has grown older than the bucket's
// window goes when the window rule lets it, though nothing else happens
// then: here the report (no request left, full again in 6 s) comes at
// 0 s, one request goes at 0.7 s and hangs for five minutes, and the
// call that asks at 1 s is let through at 6 s, when the report is as old
// as the window, not when the hanging request comes back.
func TestPacedWaitWakesAtTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newDesk("a", func(n int) (time.Duration, error) {
			if n == 2 {
				return 5 * time.Minute, nil
			}
			return 0, nil
		})
		report := func(ctx context.Context, req string) (string, error) {
			if req == "warm" {
				llmretry.ReportLimits(ctx, limitHeader(10, 0, 6*sec))
			}
			return a.Call(ctx, req)
		}
		c := &chain{Backends: []backend{{Model: "a", Call: report, Breaker: &llmretry.Breaker{},
			Retry: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 10 * time.Minute}}}}
		if _, err := c.Do(t.Context(), "warm"); err != nil {
			t.Fatal(err)
		}
		hang := doAt(t.Context(), c, 700*ms, "hangs")
		late := doAt(t.Context(), c, sec, "waits")
		if r := <-late; r.err != nil {
			t.Fatalf("Do() = %v, want an answer", r.err)
		}
		want := []sent{{0, "warm"}, {700 * ms, "hangs"}, {6 * sec, "waits"}}
		if diff := cmp.Diff(want, a.log()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
		<-hang
	})
}

// A call waiting for another process's probe goes when that probe's
// lease runs out (the process died), not at its own bound: here the
// lease ends at 11 s.
func TestSharedWaitWakesAtProbeLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "openai/gpt-4o"
		store := &llmretrytest.MemoryStore{}
		start := time.Now()
		otherProcess(t, store, key, func(st *llmretry.FleetState) {
			*st = llmretry.FleetState{Failures: 1, Until: start.Add(-sec), Kind: llmretry.KindTransient, Hinted: true, Opened: 1,
				ProbeOwner: "dead/1", ProbeUntil: start.Add(11 * sec)}
		})
		a := newDesk("a", takes(0))
		retry := llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 10 * time.Minute}
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: retry, Breaker: &llmretry.Breaker{Store: store, Key: key}}}}
		if r := <-doAt(t.Context(), c, 0, "waits"); r.err != nil {
			t.Fatalf("Do() = %v, want an answer", r.err)
		}
		if diff := cmp.Diff([]sent{{11 * sec, "waits"}}, a.log()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
}

// MaxWait caps a report's Retry-After whatever ended the attempt that
// made it: here the caller cancels while its request waits for a 429
// that says 3600 s, and the backend is paced for no longer than its
// MaxWait of 30 s.
func TestMaxWaitCapsReportOfCancelledAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{}
		call := func(ctx context.Context, _ string) (string, error) {
			<-ctx.Done()
			h := limitHeader(10, 0, time.Minute)
			h.Set("Retry-After", "3600")
			return "", llmretry.StatusFailure(http.StatusTooManyRequests, h, ctx.Err())
		}
		c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br,
			Retry: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 30 * sec}}}}
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(sec, cancel)
		if _, err := c.Do(ctx, "r"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Do() = %v, want cancelled", err)
		}
		st := br.State()
		if st.NextAdmission.IsZero() || st.NextAdmission.After(time.Now().Add(30*sec)) {
			t.Errorf("State().NextAdmission = %v from now, want a report capped at MaxWait (30s)", time.Until(st.NextAdmission))
		}
	})
}

// Calls of one process that decide at once on a shared key decide
// together: none loses a compare-and-swap to a sibling, none is decided
// from local state, and the store's calls do not grow with them.
func TestSiblingsShareTheStore(t *testing.T) {
	for _, n := range []int{16, 64} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &llmretrytest.MemoryStore{Latency: ms}
				br := &llmretry.Breaker{Store: store, Key: "k"}
				a := newDesk("a", takes(100*ms))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
				var wg sync.WaitGroup
				var errs atomic.Int64
				for i := range n {
					wg.Go(func() {
						if _, err := c.Do(t.Context(), strconv.Itoa(i)); err != nil {
							errs.Add(1)
						}
					})
				}
				wg.Wait()
				if errs.Load() != 0 {
					t.Fatalf("%d of %d calls failed", errs.Load(), n)
				}
				if st := br.State(); st.StoreErrors != 0 {
					t.Errorf("State().StoreErrors = %d (%v), want 0: siblings decide together", st.StoreErrors, st.StoreErr)
				}
				if c := store.Calls(); c.Swaps > 4 || c.Loads > 4 {
					t.Errorf("store calls = %+v for %d calls at once, want at most 4 loads and 4 swaps", c, n)
				}
			})
		})
	}
}

// failNth is a store whose n-th compare-and-swap fails without writing,
// as a database that timed out before the commit.
type failNth struct {
	llmretrytest.MemoryStore
	n, swaps atomic.Int64
}

func (s *failNth) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if s.swaps.Add(1) == s.n.Load() {
		return false, errors.New("connection reset")
	}
	return s.MemoryStore.CompareAndSwap(ctx, key, version, next)
}

// The outcome of a request whose write the store did not take is written
// with the next write: the fleet does not count the request in flight
// for the whole ProbeLease.
func TestLostOutcomeWriteIsCarried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &failNth{}
		store.n.Store(2) // the first call's admission lands; its outcome does not
		br := &llmretry.Breaker{Store: store, Key: "k"}
		call := func(ctx context.Context, req string) (string, error) {
			llmretry.ReportLimits(ctx, limitHeader(100, 90, time.Minute))
			return "ok", nil
		}
		c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
		for i := range 2 {
			if _, err := c.Do(t.Context(), strconv.Itoa(i)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(sec)
		}
		data, _, err := store.Load(t.Context(), "k")
		st, _ := llmretry.DecodeFleetState(data)
		if err != nil || st.Admitted != 2 || st.Back != 2 || st.InFlight != 0 {
			t.Errorf("stored state = %+v, %v; want 2 requests let through, 2 back, none in flight", st, err)
		}
		if got := br.State().StoreErrors; got != 1 {
			t.Errorf("State().StoreErrors = %d, want 1", got)
		}
	})
}

// No call returns after its deadline because of the store: a store that
// takes a second a call, with a StoreTimeout of 10 s, holds a call whose
// deadline is 100 ms away for no longer than that.
func TestStoreBoundedByCallerDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: sec}
		br := &llmretry.Breaker{Store: store, Key: "k", StoreTimeout: 10 * sec}
		c := &chain{Backends: []backend{{Model: "a", Call: newDesk("a", takes(0)).Call, Breaker: br}}}
		ctx, cancel := context.WithTimeout(t.Context(), 100*ms)
		defer cancel()
		start := time.Now()
		c.Do(ctx, "r")
		if took := time.Since(start); took > 100*ms {
			t.Errorf("Do() took %v with a 100ms deadline, want no longer", took)
		}
		// The sync goes on without the call, to write its outcome; the
		// bubble ends when the store has answered.
		time.Sleep(10 * sec)
	})
}

// After the store fails for 100 ms, calls wait no longer than they
// would without a store. Here two processes share a store; the backend
// failed five times (its breaker opened for a second), is up again, and
// the store fails while the half-open probe's outcome is on its way: that
// outcome must not be lost, or the fleet would wait for a probe in flight
// for the whole ProbeLease. Every call is answered, and none waits longer
// than the slowest call of the same run without a store, plus a second.
func TestStoreHiccupCostsNoWait(t *testing.T) {
	play := func(t *testing.T, store *llmretrytest.MemoryStore) (slowest time.Duration) {
		synctest.Test(t, func(t *testing.T) {
			a := newDesk("a", takes(200*ms))
			chains := make([]*chain, 2)
			for i := range chains {
				br := &llmretry.Breaker{Cooldown: 1050 * ms}
				if store != nil {
					br.Store, br.Key = store, "k"
				}
				if i == 0 || store == nil {
					trip(t, br, errDown) // open for the fleet until 1.05 s
				}
				chains[i] = &chain{Backends: []backend{{Model: "m", Call: a.Call, Breaker: br,
					Retry: llmretry.Policy{Waits: []time.Duration{sec, 2 * sec}, Reserve: 10 * sec}}}}
			}
			if store != nil {
				// The probe goes at 1.05 s and answers at 1.25 s: the store
				// is down from 1.2 s to 1.3 s.
				time.AfterFunc(1200*ms-time.Duration(0), func() { store.Fail(errors.New("down")) })
				time.AfterFunc(1300*ms, func() { store.Fail(nil) })
			}
			var (
				wg sync.WaitGroup
				mu sync.Mutex
			)
			for i := range 20 {
				wg.Go(func() {
					time.Sleep(1000*ms + time.Duration(i)*250*ms)
					ctx, cancel := context.WithTimeout(context.Background(), 30*sec)
					defer cancel()
					begin := time.Now()
					if _, err := chains[i%2].Do(ctx, strconv.Itoa(i)); err != nil {
						t.Errorf("call %d: %v", i, err)
					}
					mu.Lock()
					slowest = max(slowest, time.Since(begin))
					mu.Unlock()
				})
			}
			wg.Wait()
		})
		return slowest
	}
	alone := play(t, nil)
	shared := play(t, &llmretrytest.MemoryStore{Latency: 2 * ms})
	t.Logf("slowest call: %v alone, %v sharing a store that failed for 100 ms", alone, shared)
	if shared > alone+sec {
		t.Errorf("slowest call after a 100 ms store failure: %v; without a store: %v", shared, alone)
	}
}

// A store that fails for 100 ms costs a fleet paced by its provider's
// rate limits no wait it would not have had without a store: every call
// is answered, none takes more than a second longer than the slowest
// call of the same run without a store, and the run ends no more than a
// second later. Two processes, five workers each, send 60 calls with 30 s
// deadlines to a provider that takes 10 requests at once and one more
// every 200 ms, and says so in its headers; paced by them, the run takes
// about 10.5 s. The store fails at moments 50 ms apart from 1 s to 3 s,
// so that some failure catches every store call of that time in flight,
// the writes of requests' outcomes among them: an outcome the fleet's
// state never got would keep its request in flight for the whole
// ProbeLease, and pacing would count it against the limit, holding calls
// back until their bound (20 s: the deadline less the reserve).
func TestStoreHiccupKeepsPace(t *testing.T) {
	type run struct {
		took, slowest   time.Duration // the whole run's, and its slowest call's
		failed, refused int           // calls that returned an error; the provider's 429s
	}
	// play runs the 60 calls; with a store, it fails from down to
	// down+100ms (down < 0: never).
	play := func(t *testing.T, store *llmretrytest.MemoryStore, down time.Duration) (r run) {
		synctest.Test(t, func(t *testing.T) {
			// The provider meters its bucket as a request arrives (full
			// is when it is full again), answers 200 ms later with the
			// headers, and refuses a request it cannot take at once, with
			// a 429 that says when to come back.
			const burst, every = 10, 200 * ms
			var (
				mu   sync.Mutex
				full time.Time
			)
			provider := func(ctx context.Context, req string) (string, error) {
				mu.Lock()
				now := time.Now()
				if full.Before(now) {
					full = now
				}
				used := int((full.Sub(now) + every - 1) / every)
				if used == burst {
					r.refused++
					h := limitHeader(burst, 0, full.Sub(now))
					h.Set("Retry-After", strconv.Itoa(int((full.Sub(now)-(burst-1)*every+sec-1)/sec)))
					mu.Unlock()
					return "", llmretry.StatusFailure(http.StatusTooManyRequests, h, errors.New("rate limited"))
				}
				full = full.Add(every)
				h := limitHeader(burst, burst-used-1, full.Sub(now))
				mu.Unlock()
				if !sleepCtx(ctx, 200*ms) {
					return "", ctx.Err()
				}
				llmretry.ReportLimits(ctx, h)
				return req, nil
			}
			chains := make([]*chain, 2)
			for i := range chains {
				br := &llmretry.Breaker{}
				if store != nil {
					br.Store, br.Key = store, "k"
				}
				chains[i] = &chain{Backends: []backend{{Model: "m", Call: provider, Breaker: br,
					Retry: llmretry.Policy{Waits: []time.Duration{sec, 2 * sec}, Reserve: 10 * sec}}}}
			}
			if store != nil && down >= 0 {
				time.AfterFunc(down, func() { store.Fail(errors.New("down")) })
				time.AfterFunc(down+100*ms, func() { store.Fail(nil) })
			}
			start := time.Now()
			var wg sync.WaitGroup
			for p, c := range chains {
				jobs := make(chan string, 30)
				for i := range 30 {
					jobs <- strconv.Itoa(2*i + p)
				}
				close(jobs)
				for range 5 {
					wg.Go(func() {
						for req := range jobs {
							ctx, cancel := context.WithTimeout(context.Background(), 30*sec)
							begin := time.Now()
							_, err := c.Do(ctx, req)
							cancel()
							mu.Lock()
							r.slowest = max(r.slowest, time.Since(begin))
							if err != nil {
								r.failed++
							}
							mu.Unlock()
						}
					})
				}
			}
			wg.Wait()
			r.took = time.Since(start)
			// What a sync writes after its call has returned lands before
			// the bubble ends.
			time.Sleep(time.Minute)
		})
		return r
	}
	alone := play(t, nil, -1)
	t.Logf("without a store: %+v", alone)
	if alone.failed > 0 {
		t.Fatalf("without a store, %d calls failed, want none", alone.failed)
	}
	check := func(what string, got run) {
		t.Helper()
		if got.failed > 0 || got.took > alone.took+sec || got.slowest > alone.slowest+sec {
			t.Errorf("%s: run %v, slowest call %v, %d calls failed; without a store: %v, %v, none failed",
				what, got.took, got.slowest, got.failed, alone.took, alone.slowest)
		}
	}
	// The store that does not fail first: contention alone must lose no
	// outcome either.
	check("store that does not fail", play(t, &llmretrytest.MemoryStore{Latency: 2 * ms}, -1))
	for down := sec; down <= 3*sec; down += 50 * ms {
		check("store down from "+down.String()+" for 100ms", play(t, &llmretrytest.MemoryStore{Latency: 2 * ms}, down))
	}
}

// A paced wait's record says paced, whether the call was let through or
// held past its bound, and the error's summary names pacing and what
// bounds it.
func TestPacedRecordsAndSummary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		call := func(ctx context.Context, req string) (string, error) {
			llmretry.ReportLimits(ctx, limitHeader(10, 0, 10*sec))
			return "ok", nil
		}
		var rec pacedRecorder
		br := &llmretry.Breaker{}
		c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br,
			Retry: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 30 * sec}}}, OnAttempt: rec.on}
		if _, err := c.Do(t.Context(), "warm"); err != nil {
			t.Fatal(err)
		}
		// T is 1 s away: the next call waits for it, and goes.
		if _, err := c.Do(t.Context(), "waits"); err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		recs := rec.recs[1:] // after the warm call's answer
		rec.mu.Unlock()
		if len(recs) != 2 || !recs[0].Skipped || recs[0].Why != llmretry.WhyPaced || recs[0].Next != llmretry.NextRetry {
			t.Fatalf("records = %v, want a paced wait, then the answer", recs)
		}
		if got, want := recs[0].String(), "[backend 0 a try 1] skipped: paced by the provider's rate limits (retrying in 1s)"; got != want {
			t.Errorf("record = %q, want %q", got, want)
		}
		// With 500 ms left before the deadline, the next call cannot wait
		// for T: held past its bound.
		ctx, cancel := context.WithTimeout(t.Context(), 500*ms)
		defer cancel()
		_, err := c.Do(ctx, "held")
		var ex *llmretry.Exhausted
		if !errors.As(err, &ex) {
			t.Fatalf("Do() = %v, want an Exhausted", err)
		}
		if got := ex.Attempts[len(ex.Attempts)-1]; got.Why != llmretry.WhyPaced {
			t.Errorf("last record = %v, want Why paced", got)
		}
		if msg := err.Error(); !containsAll(msg, "rate limits", "MaxWait") || containsAll(msg, "widen the retry waits") {
			t.Errorf("Error() = %q, want a summary that names the rate limits and what bounds the wait", msg)
		}
	})
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
