package llmretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The tests in this file hold a Breaker with a Store to what it owes the
// fleet when the store, or a call's deadline, lets it down: what the
// store did not take is neither lost nor counted twice, a live process's
// requests stay counted, a dead one's go back, and every call is woken
// when its lot changes. Times are virtual, and exact.

// tally is what the stored state counts of the fleet's requests.
type tally struct {
	Admitted, Back uint64
	InFlight       int64 // the processes' entries' sum
}

// storedTally reads key's state in store as another process would.
func storedTally(t *testing.T, store *llmretrytest.MemoryStore, key string) tally {
	t.Helper()
	st := storedState(t, store, key)
	return tally{st.Admitted, st.Back, st.InFlight}
}

// storedState reads key's state in store, and fails the test when it
// cannot.
func storedState(t *testing.T, store *llmretrytest.MemoryStore, key string) llmretry.FleetState {
	t.Helper()
	data, _, err := store.Load(context.Background(), key)
	st, derr := llmretry.DecodeFleetState(data)
	if err := errors.Join(err, derr); err != nil {
		t.Fatal(err)
	}
	return st
}

// reportingCall is a backend that reports a requests bucket of 100 with
// 50 left on every call, and answers after lasts(req), or fails with
// its context's error when that ends first.
func reportingCall(lasts func(req string) time.Duration) func(context.Context, string) (string, error) {
	return func(ctx context.Context, req string) (string, error) {
		llmretry.ReportLimits(ctx, limitHeader(100, 50, time.Minute))
		if !sleepCtx(ctx, lasts(req)) {
			return "", ctx.Err()
		}
		return req, nil
	}
}

// withTokens is limitHeader with a tokens bucket of 10,000 a minute,
// remaining left.
func withTokens(remaining string) http.Header {
	h := limitHeader(1000, 900, time.Minute)
	h.Set("X-Ratelimit-Limit-Tokens", "10000")
	h.Set("X-Ratelimit-Remaining-Tokens", remaining)
	h.Set("X-Ratelimit-Reset-Tokens", "1m0s")
	return h
}

// estimate is every request's Estimate in the tests of tokens.
func estimate(string) llmretry.Usage { return llmretry.Usage{InputTokens: 100, OutputTokens: 500} }

// A change decided while a write is on its way is not in that write, and
// is kept for the next one: here a call's outcome (its attempt cut by
// its deadline) and another call's admission (decided on the view when
// its deadline came before any sync took it) both come while the
// compare-and-swap of a third call's outcome is on its way. Once every
// call is done, the store counts every request let through, and all back.
func TestFleetKeepsChangesDecidedDuringAWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: 100 * ms}
		br := &llmretry.Breaker{Store: store, Key: "k", StoreTimeout: sec}
		call := reportingCall(func(req string) time.Duration {
			if req == "Y" {
				return time.Hour
			}
			return 500 * ms
		})
		c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
		c.Do(t.Context(), "warm") // a report first: every admission is then written
		// X and Y are sent at t1+200ms (a load and a write); X answers at
		// t1+700ms, and its outcome's write is on its way from t1+800ms
		// to t1+900ms. Y is cut, and Z asks, within it.
		t1 := time.Now()
		yctx, cancel := context.WithDeadline(t.Context(), t1.Add(840*ms))
		defer cancel()
		zctx, cancel := context.WithDeadline(t.Context(), t1.Add(860*ms))
		defer cancel()
		outs := []<-chan outcome{doAt(t.Context(), c, 0, "X"), doAt(yctx, c, 0, "Y"), doAt(zctx, c, 820*ms, "Z")}
		for _, o := range outs {
			<-o
		}
		time.Sleep(sec)
		c.Do(t.Context(), "last") // a decision with nothing in flight: the state is read again
		// Let through: warm, X, Y, Z (whether or not its request went
		// out, its deadline having come as it was let through) and last.
		if diff := cmp.Diff(tally{Admitted: 5, Back: 5}, storedTally(t, store, "k")); diff != "" {
			t.Errorf("stored counts after every call (-want +got):\n%s", diff)
		}
	})
}

// lostAnswer is a store whose compare-and-swap, once armed, writes and
// then fails as if its answer were lost on the way back, and whose load,
// once armed, fails.
type lostAnswer struct {
	llmretrytest.MemoryStore
	swap, load atomic.Bool
}

func (s *lostAnswer) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	ok, err := s.MemoryStore.CompareAndSwap(ctx, key, version, next)
	if s.swap.CompareAndSwap(true, false) {
		return false, errors.New("connection reset") // it landed
	}
	return ok, err
}

func (s *lostAnswer) Load(ctx context.Context, key string) ([]byte, int64, error) {
	if s.load.CompareAndSwap(true, false) {
		return nil, 0, errors.New("connection reset")
	}
	return s.MemoryStore.Load(ctx, key)
}

// A write whose answer was lost, and which the state later shows landed,
// takes with it only what it held: an outcome decided afterwards, while
// the store could not be read, is written all the same. Here request 1's
// admission lands unanswered, its outcome comes while a load fails, and
// request 2's decision, which reads the state again, writes it: the
// store counts what it counts when nothing fails. A store whose notices
// carry the state shows the write landed with its notice, and no load
// fails.
func TestFleetWritesWhatALandedWriteDidNotHold(t *testing.T) {
	for _, stateless := range []bool{true, false} {
		t.Run(fmt.Sprintf("stateless_notices=%v", stateless), func(t *testing.T) {
			wantErrs := int64(1) // the lost answer
			if stateless {
				wantErrs = 2 // and the failed load
			}
			landedUnanswered(t, stateless, wantErrs)
		})
	}
}

func landedUnanswered(t *testing.T, stateless bool, wantErrs int64) {
	run := func(fail bool) (tally, int64) {
		var got tally
		var errs int64
		synctest.Test(t, func(t *testing.T) {
			store := &lostAnswer{}
			store.StatelessNotices = stateless
			br := &llmretry.Breaker{Store: store, Key: "k"}
			call := reportingCall(func(req string) time.Duration {
				if req == "0" {
					return 0
				}
				return sec
			})
			c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
			c.Do(t.Context(), "0")
			store.swap.Store(fail)
			done := doAt(t.Context(), c, 0, "1")
			time.Sleep(500 * ms)
			store.load.Store(fail)
			<-done
			time.Sleep(500 * ms)
			c.Do(t.Context(), "2")
			got, errs = storedTally(t, &store.MemoryStore, "k"), br.State().StoreErrors
		})
		return got, errs
	}
	want, _ := run(false)
	if diff := cmp.Diff(tally{Admitted: 3, Back: 3}, want); diff != "" {
		t.Fatalf("stored counts with a store that never fails (-want +got):\n%s", diff)
	}
	got, errs := run(true)
	if errs != wantErrs {
		t.Errorf("State().StoreErrors = %d, want %d", errs, wantErrs)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stored counts after a lost answer (-as without it +got):\n%s", diff)
	}
}

// The outcome of a call whose deadline came while the store was slow is
// written all the same: here process A's probe of a half-open backend
// is cut by A's deadline, and the store then shows the probe free and
// nothing in flight, so that process B's call, later, probes the
// backend instead of skipping it for its fallback.
func TestFleetWritesAProbeCutByItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "k"
		store := &llmretrytest.MemoryStore{Latency: 2 * ms}
		otherProcess(t, store, key, func(st *llmretry.FleetState) {
			*st = llmretry.FleetState{Failures: 5, Until: time.Now().Add(sec), Kind: llmretry.KindTransient, Opened: 1}
		})
		hung, ok, fb := newDesk("hung", takes(time.Hour)), newDesk("ok", takes(0)), newDesk("fallback", takes(0))
		process := func(d *desk) *chain {
			return &chain{Backends: []backend{
				{Model: "a", Call: d.Call, Breaker: &llmretry.Breaker{Store: store, Key: key}},
				{Model: "f", Call: fb.Call},
			}}
		}
		a, b := process(hung), process(ok)
		time.Sleep(2 * sec)
		ctx, cancel := context.WithTimeout(t.Context(), sec)
		defer cancel()
		if _, err := a.Do(ctx, "A"); !isTimedOut(err) || len(hung.log()) != 1 {
			t.Fatalf("A: Do() = %v, backend got %v; want A's probe sent, and timed out", err, hung.log())
		}
		time.Sleep(500 * ms)
		st := storedState(t, store, key)
		if st.ProbeOwner != "" || st.InFlight != 0 {
			t.Errorf("stored after A's call: probe held by %q, %d in flight; want it free, none", st.ProbeOwner, st.InFlight)
		}
		got, err := b.Do(t.Context(), "B")
		if got != "ok: B" || err != nil || fb.log() != nil {
			t.Errorf("B: Do() = %q, %v (fallback got %v); want the backend's answer", got, err, fb.log())
		}
	})
}

// A request let through by a decision whose write the store did not
// take is counted by this process alone, and written with the next
// write: the store and the Breaker count what they count when nothing
// fails. Here request 2's admission is not written; request 3's write,
// a second later, carries it.
func TestFleetCountsRequestsLetThroughByAFailedWrite(t *testing.T) {
	type counts struct {
		InFlight   tally // while requests 2 and 3 are out
		LetThrough int
		Done       tally // once they are back
	}
	run := func(fail bool) counts {
		var got counts
		synctest.Test(t, func(t *testing.T) {
			store := &failNth{}
			br := &llmretry.Breaker{Store: store, Key: "k"}
			call := reportingCall(func(req string) time.Duration {
				if req == "1" {
					return 0
				}
				return 10 * sec
			})
			c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
			c.Do(t.Context(), "1")
			if fail {
				store.n.Store(store.swaps.Load() + 1) // request 2's
			}
			outs := []<-chan outcome{doAt(t.Context(), c, 0, "2"), doAt(t.Context(), c, sec, "3")}
			time.Sleep(2 * sec)
			got.InFlight, got.LetThrough = storedTally(t, &store.MemoryStore, "k"), br.State().LetThrough
			for _, o := range outs {
				<-o
			}
			time.Sleep(sec)
			got.Done = storedTally(t, &store.MemoryStore, "k")
		})
		return got
	}
	want := counts{InFlight: tally{3, 1, 2}, LetThrough: 2, Done: tally{3, 3, 0}}
	if diff := cmp.Diff(want, run(false)); diff != "" {
		t.Fatalf("with a store that never fails (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, run(true)); diff != "" {
		t.Errorf("with request 2's write not taken (-want +got):\n%s", diff)
	}
}

// leasedProcess is a process of the lease tests: a chain whose Breaker
// shares store under "k" with a 10 s lease, on a backend that reports its
// limits and answers "long" after 25 s and anything else at once.
func leasedProcess(store *llmretrytest.MemoryStore) *chain {
	call := reportingCall(func(req string) time.Duration {
		if req == "long" {
			return 25 * sec
		}
		return 0
	})
	br := &llmretry.Breaker{Store: store, Key: "k", ProbeLease: 10 * sec}
	return &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
}

// Every write of a process renews its lease: a live process's requests
// in flight are never taken as back by another. Here process P keeps
// three requests out for 25 s, past its 10 s lease, while it makes a
// quick call every second; Q's call at 20.5 s leaves them counted.
func TestFleetRenewsALiveProcessLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: ms}
		p, q := leasedProcess(store), leasedProcess(store)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { p.Do(t.Context(), "long") })
		}
		wg.Go(func() {
			for range 22 {
				time.Sleep(sec)
				p.Do(t.Context(), "quick")
			}
		})
		time.Sleep(20*sec + 500*ms)
		before := storedTally(t, store, "k")
		if before.Admitted-before.Back != 3 || before.InFlight != 3 {
			t.Fatalf("stored at 20.5 s: %+v; want P's 3 requests in flight", before)
		}
		q.Do(t.Context(), "quick")
		want := tally{before.Admitted + 1, before.Back + 1, 3} // Q's request, and P's 3 still out
		if diff := cmp.Diff(want, storedTally(t, store, "k")); diff != "" {
			t.Errorf("stored after Q's call (-want +got):\n%s", diff)
		}
		wg.Wait()
	})
}

// A process whose only business is a request in flight, longer than its
// lease, keeps its entry alive all the same: an agent's turn may stream
// for minutes. Here P's one request is out for 25 s, past its 10 s lease,
// and P calls nothing else; Q's call at 20.5 s leaves it counted, and
// once it is answered every request is back, once.
func TestFleetKeepsAQuietProcessLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: ms}
		p, q := leasedProcess(store), leasedProcess(store)
		q.Do(t.Context(), "quick") // the report that makes the fleet count requests
		var wg sync.WaitGroup
		wg.Go(func() { p.Do(t.Context(), "long") })
		time.Sleep(20*sec + 500*ms)
		before := storedTally(t, store, "k")
		if before.Admitted-before.Back != 1 || before.InFlight != 1 {
			t.Fatalf("stored at 20.5 s: %+v; want P's request in flight", before)
		}
		q.Do(t.Context(), "quick")
		want := tally{before.Admitted + 1, before.Back + 1, 1} // Q's request, and P's still out
		if diff := cmp.Diff(want, storedTally(t, store, "k")); diff != "" {
			t.Errorf("stored after Q's call (-want +got):\n%s", diff)
		}
		wg.Wait()
		q.Do(t.Context(), "quick")
		after := storedTally(t, store, "k")
		if after.Admitted != after.Back || after.InFlight != 0 {
			t.Errorf("stored once every request is answered: %+v; want every request back, once", after)
		}
	})
}

// A renewal the store failed to take is tried again before the lease
// runs out: here the store fails from 7 s to 8 s, over P's renewal at
// 7.5 s, and Q's call at 11 s still finds P's request counted.
func TestFleetRenewsALeaseAfterAFailedRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: ms}
		p, q := leasedProcess(store), leasedProcess(store)
		q.Do(t.Context(), "quick")
		var wg sync.WaitGroup
		wg.Go(func() { p.Do(t.Context(), "long") })
		time.Sleep(7 * sec)
		store.Fail(errors.New("store down"))
		time.Sleep(sec)
		store.Fail(nil)
		time.Sleep(3 * sec)
		before := storedTally(t, store, "k")
		q.Do(t.Context(), "quick")
		want := tally{before.Admitted + 1, before.Back + 1, 1} // Q's request, and P's still out
		if diff := cmp.Diff(want, storedTally(t, store, "k")); diff != "" {
			t.Errorf("stored after Q's call at 11 s (-want +got):\n%s", diff)
		}
		wg.Wait()
	})
}

// The lease of a process that died running out wakes the calls in line
// behind it: here a half-open backend, whose probe is free, with a dead
// process's line first until its lease ends at 10 s. The waiting call
// probes then, after one write (2 ms): no other process wrote since it
// put itself in line, so its view is the state; not at the end of its
// 30 s bound.
func TestFleetWakesWhenADeadProcessLeaseRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key, latency = "k", 2 * ms
		store := &llmretrytest.MemoryStore{Latency: latency}
		now := time.Now()
		// As the package writes it (format 2): no FleetState holds a line.
		data, _ := json.Marshal(map[string]any{
			"v": 2, "fails": 1, "until": now.Add(-sec), "kind": "transient", "opened": 1,
			"procs": []map[string]any{{"id": "0dead", "lease": now.Add(10 * sec), "head": now.Add(-time.Hour), "waiting": 1}},
		})
		if ok, err := store.CompareAndSwap(t.Context(), key, 0, data); !ok || err != nil {
			t.Fatalf("CompareAndSwap() = %v, %v, want true, nil", ok, err)
		}
		a := newDesk("a", takes(0))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: &llmretry.Breaker{Store: store, Key: key},
			Retry: llmretry.Policy{Waits: []time.Duration{30 * sec}, MaxWait: 2 * time.Minute}}}}
		if _, err := c.Do(t.Context(), "r"); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]sent{{10*sec + latency, "r"}}, a.log()); diff != "" {
			t.Errorf("requests sent (-want +got):\n%s", diff)
		}
	})
}

// Without a Store, a call held back by the tokens bucket for its
// request's Estimate wakes when the bucket has room for it: here 300
// tokens of 10,000 are left, refilling in a minute, and the request is
// estimated at 600, so it goes once 300 more have come back, at
// 60 s * 300/9,700, not at the end of its 30 s bound.
func TestPacingWakesWhenTheTokensBucketHasRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sends []time.Duration
		start := time.Now()
		call := func(ctx context.Context, req string) (string, error) {
			sends = append(sends, time.Since(start))
			llmretry.ReportLimits(ctx, withTokens("300"))
			return req, nil
		}
		c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: &llmretry.Breaker{}, Estimate: estimate,
			Retry: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 30 * sec}}}}
		for _, req := range []string{"report", "held"} {
			if _, err := c.Do(t.Context(), req); err != nil {
				t.Fatal(err)
			}
		}
		const room = (time.Minute*300 + 9699) / 9700 // rounded up: not before the tokens are there
		if diff := cmp.Diff([]time.Duration{0, room}, sends); diff != "" {
			t.Errorf("requests sent at (-want +got):\n%s", diff)
		}
	})
}

// mortal is a process's way to a shared store, which dies when told:
// from then on every call fails, and the process never writes again.
type mortal struct {
	*llmretrytest.MemoryStore
	dead atomic.Bool
}

var errDead = errors.New("connection refused")

func (s *mortal) Load(ctx context.Context, key string) ([]byte, int64, error) {
	if s.dead.Load() {
		return nil, 0, errDead
	}
	return s.MemoryStore.Load(ctx, key)
}

func (s *mortal) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if s.dead.Load() {
		return false, errDead
	}
	return s.MemoryStore.CompareAndSwap(ctx, key, version, next)
}

// estimates is what a stored state counts of the requests' estimates,
// read as the package writes it (its format 2).
type estimates struct {
	Admitted uint64                     `json:"admitted"`
	Back     uint64                     `json:"back"`
	Est      struct{ N, In, Out int64 } `json:"est"`
	EstBack  struct{ N, In, Out int64 } `json:"est_back"`
}

// A process that died with a request in flight has its request's
// estimate taken back with the request when its lease runs out: the
// tokens it was charged are not held against the fleet for ever. Here
// process D dies during its second request; process C's call, after
// D's 10 s lease, finds every request back and every estimate too.
func TestFleetTakesBackADeadProcessEstimates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "k"
		shared := &llmretrytest.MemoryStore{}
		dstore := &mortal{MemoryStore: shared}
		call := func(ctx context.Context, req string) (string, error) {
			llmretry.ReportLimits(ctx, withTokens("9000"))
			if req == "last words" {
				dstore.dead.Store(true)
			}
			return req, nil
		}
		process := func(store llmretry.BreakerStore) *chain {
			br := &llmretry.Breaker{Store: store, Key: key, ProbeLease: 10 * sec}
			return &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br, Estimate: estimate}}}
		}
		d, c := process(dstore), process(shared)
		for _, req := range []string{"report", "last words"} {
			if _, err := d.Do(t.Context(), req); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(11 * sec)
		if _, err := c.Do(t.Context(), "after"); err != nil {
			t.Fatal(err)
		}
		data, _, err := shared.Load(t.Context(), key)
		var got estimates
		if err == nil {
			err = json.Unmarshal(data, &got)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := got
		want.Back, want.EstBack = got.Admitted, got.Est
		if got.Admitted != 3 || got.Est.N != 3 {
			t.Errorf("stored %+v; want 3 requests let through, each with its estimate", got)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("stored once every request is back (-want +got):\n%s", diff)
		}
	})
}

// The store calls of a sync are bounded by StoreTimeout, never by the
// nearest deadline of the calls it decides for: a call about to give
// up does not make its batch decide without the store. Here two calls
// ask at once, one with 1 ms left, of a healthy store that answers in
// 2 ms: no store call fails, and the other call's admission is written.
func TestFleetBatchOutlivesOneCallsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: 2 * ms}
		br := &llmretry.Breaker{Store: store, Key: "k"}
		c := &chain{Backends: []backend{{Model: "a", Call: reportingCall(func(string) time.Duration { return sec }), Breaker: br}}}
		c.Do(t.Context(), "report")
		short, cancel := context.WithTimeout(t.Context(), ms)
		defer cancel()
		outs := []<-chan outcome{doAt(short, c, 0, "short"), doAt(t.Context(), c, 0, "long")}
		time.Sleep(500 * ms)
		if got := br.State(); got.StoreErrors != 0 {
			t.Errorf("State().StoreErrors = %d (%v), want 0", got.StoreErrors, got.StoreErr)
		}
		// The report's request back; short's let through as its
		// deadline came, and given back; long's still out.
		if diff := cmp.Diff(tally{Admitted: 3, Back: 2, InFlight: 1}, storedTally(t, store, "k")); diff != "" {
			t.Errorf("stored while long's request is out (-want +got):\n%s", diff)
		}
		for _, o := range outs {
			<-o
		}
	})
}

// A call cut while it waits only for its turn says what held it: its
// turn, which is pacing's (Kind transient), and its deadline, which
// stopped it; not a breaker opened by unknown failures, for a breaker
// that is closed. Here the store takes 50 ms a call and the call has
// 10 ms: its deadline comes while its admission is on its way.
func TestFleetCallCutOnItsTurnSaysWhatHeldIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: 50 * ms}
		br := &llmretry.Breaker{Store: store, Key: "k"}
		a := newDesk("a", takes(0))
		var rec pacedRecorder
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}, OnAttempt: rec.on}
		ctx, cancel := context.WithTimeout(t.Context(), 10*ms)
		defer cancel()
		start := time.Now()
		_, err := c.Do(ctx, "r")
		if !isTimedOut(err) || a.log() != nil {
			t.Errorf("Do() = %v, backend got %v; want timed out, nothing sent", err, a.log())
		}
		want := []llmretry.Attempt{{Model: "a", Try: 1, Kind: llmretry.KindTransient, Start: start.Add(10 * ms),
			Skipped: true, Next: llmretry.NextStop, Why: llmretry.WhyDeadline}}
		if diff := cmp.Diff(want, rec.recs, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		if st := br.State(); st.Open {
			t.Errorf("State() = %+v, want closed", st)
		}
		time.Sleep(sec) // the sync goes on without the call
	})
}
