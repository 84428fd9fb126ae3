package llmretry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The tests in this file hold a Breaker to what it does with a store
// whose notices carry the state (llmretry.StateNotifier): it decides on
// the state a notice brought, without a load, and loads only when the
// notices cannot say what the state is.

// A process that has never read the state decides on the one the store's
// notices brought: here the other process opened the backend, and this
// one's call skips it without a store call. With notices that carry no
// state it loads first, and decides alike.
func TestFleetDecidesOnNoticedState(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		t.Run(fmt.Sprintf("stateless_notices=%v", stateless), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &llmretrytest.MemoryStore{Latency: 2 * ms, StatelessNotices: stateless}
				brs := fleet(2, true, store)
				trip(t, brs[0], errDown)
				time.Sleep(ms) // the notices of its writes arrive
				a, b := newDesk("a", takes(0)), newDesk("b", takes(0))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: brs[1]}, {Model: "b", Call: b.Call}}}
				before := store.Calls()
				if got, err := c.Do(t.Context(), "r"); got != "b: r" || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "b: r")
				}
				loads := store.Calls().Loads - before.Loads
				want := int64(0)
				if stateless {
					want = 1
				}
				if loads != want || len(a.log()) != 0 {
					t.Errorf("%d loads, %d requests to the open backend; want %d and none", loads, len(a.log()), want)
				}
			})
		})
	}
}

// laggingNotices is a MemoryStore whose notices, once frozen, go on
// telling of the state they told of then (notices that lag the writes),
// or of one the test sets.
type laggingNotices struct {
	llmretrytest.MemoryStore
	frozen atomic.Pointer[noticed]
}

type noticed struct {
	state []byte
	ver   int64
}

func (s *laggingNotices) freeze() {
	state, ver, _ := s.MemoryStore.Noticed("k")
	s.frozen.Store(&noticed{state, ver})
}

func (s *laggingNotices) Noticed(key string) ([]byte, int64, bool) {
	if n := s.frozen.Load(); n != nil {
		return n.state, n.ver, true
	}
	return s.MemoryStore.Noticed(key)
}

// A compare-and-swap that finds the state changed is followed by a load
// when the notices have not told of the change yet: deciding again on
// the notices' state would lose again, until the store's time ran out.
// Here two processes let a request through at one instant, on the state
// the notices told of; the one whose write loses reads the winner's and
// writes its own, and neither decides without the store.
func TestFleetLoadsWhenNoticesLagAConflict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &laggingNotices{}
		store.Latency = 2 * ms
		brs := []*llmretry.Breaker{{Store: store, Key: "k"}, {Store: store, Key: "k"}}
		chains := make([]*chain, 2)
		for i, br := range brs {
			chains[i] = &chain{Backends: []backend{{Model: "a", Call: reportingCall(func(string) time.Duration { return sec }), Breaker: br}}}
		}
		if _, err := chains[0].Do(t.Context(), "warm"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ms)
		store.freeze()
		outs := []<-chan outcome{doAt(t.Context(), chains[0], 0, "x"), doAt(t.Context(), chains[1], 0, "y")}
		for _, o := range outs {
			if r := <-o; r.err != nil {
				t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
			}
		}
		for i, br := range brs {
			if st := br.State(); st.StoreErrors != 0 {
				t.Errorf("process %d: State().StoreErrors = %d (%v), want 0", i, st.StoreErrors, st.StoreErr)
			}
		}
		if diff := cmp.Diff(tally{Admitted: 3, Back: 3}, storedTally(t, &store.MemoryStore, "k")); diff != "" {
			t.Errorf("stored counts (-want +got):\n%s", diff)
		}
	})
}

// A pool chooses by the state the store's notices brought: here another
// process opened deployment a, and this process's request goes straight
// to b, with no store call for a and no skip of a in its records.
func TestPoolChoosesByNoticedState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{Latency: 2 * ms}
		da, db := newDesk("a", takes(0)), newDesk("b", takes(0))
		pa := deployment("a", da, 0)
		pa.Backend.Breaker = &llmretry.Breaker{Store: store, Key: "a"}
		pb := deployment("b", db, 0)
		var rec pacedRecorder
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb}}}, OnAttempt: rec.on}
		trip(t, &llmretry.Breaker{Store: store, Key: "a"}, errDown)
		time.Sleep(ms)
		before := store.Calls()
		if got, err := c.Do(context.Background(), "r"); got != "b: r" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "b: r")
		}
		if diff := cmp.Diff([]string{"b:only"}, where(rec.recs)); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		if got := store.Calls(); got != before {
			t.Errorf("store calls for a: %+v, then %+v; want none", before, got)
		}
	})
}

// earlyNotices is a laggingNotices whose notice of a write can come
// before the write's answer, as PostgreSQL's may, and which can fail the
// next compare-and-swap before writing. During tells the test of a write
// on its way, its notice already come.
type earlyNotices struct {
	laggingNotices
	failNext atomic.Bool
	during   func()
}

func (s *earlyNotices) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if s.failNext.CompareAndSwap(true, false) {
		return false, errors.New("connection reset")
	}
	ok, err := s.MemoryStore.CompareAndSwap(ctx, key, version, next)
	if ok && s.during != nil {
		s.frozen.Store(&noticed{bytes.Clone(next), version + 1})
		s.during()
	}
	return ok, err
}

// A notice of a write that comes before the write's answer leaves the
// view alone until the answer: the sync that made the write counts on
// what it carried. Here a write fails unanswered, so what it held is
// carried into the next, and while that next is on its way its notice
// comes and another goroutine (a pool's choice) reads the notices.
func TestFleetNoticeOfAWriteOnItsWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &earlyNotices{}
		br := &llmretry.Breaker{Store: store, Key: "k"}
		c := &chain{Backends: []backend{{Model: "a", Call: reportingCall(func(string) time.Duration { return 0 }), Breaker: br}}}
		if _, err := c.Do(t.Context(), "warm"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ms)
		store.failNext.Store(true)
		store.during = func() { llmretry.Freshen(br) }
		if _, err := c.Do(t.Context(), "carried"); err != nil {
			t.Fatal(err)
		}
		store.during = nil
		store.frozen.Store(nil)
		time.Sleep(ms)
		if _, err := c.Do(t.Context(), "after"); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tally{Admitted: 3, Back: 3}, storedTally(t, &store.MemoryStore, "k")); diff != "" {
			t.Errorf("stored counts (-want +got):\n%s", diff)
		}
	})
}

// What a process decided while the store was down reaches the store
// with its next write, also when a pool read the process's standing in
// between: here the breaker opened while the store failed, a pool reads
// its standing once the store is back, and the next call's sync writes
// the breaker open for the fleet, whose other process then skips it.
func TestFleetStandingKeepsCarry(t *testing.T) {
	for _, look := range []bool{false, true} {
		t.Run(fmt.Sprintf("standing_read=%v", look), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &llmretrytest.MemoryStore{Latency: 2 * ms}
				brs := fleet(2, true, store)
				fail := func(context.Context, string) (string, error) { return "", errDown }
				c := &chain{Backends: []backend{{Model: "a", Call: fail, Breaker: brs[0]}}}
				c.Do(t.Context(), "before")
				time.Sleep(ms)
				store.Fail(errors.New("down"))
				trip(t, brs[0], errDown)
				store.Fail(nil)
				time.Sleep(ms)
				if look {
					llmretry.ReadStanding(brs[0])
				}
				c.Do(t.Context(), "after") // skipped: its sync writes what was carried
				time.Sleep(ms)
				if st := storedState(t, store, "openai/gpt-4o"); st.Until.IsZero() {
					t.Errorf("stored %+v, want the breaker open", st)
				}
				a := newDesk("a", takes(0))
				other := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: brs[1]}}}
				other.Do(t.Context(), "other")
				if len(a.log()) != 0 {
					t.Errorf("the other process sent %v, want a skip: the breaker is open", a.log())
				}
			})
		})
	}
}

// trailingNotices is a MemoryStore under contention: its notices trail
// the writes by one, each telling of the state before the store's
// current one, and once contended, another process writes after each
// compare-and-swap that loses, so that the store has moved on again by
// the time the loser tries anew. Its notices stand for ones still on
// their way, as they trail the store for good: where a Watch runs, it
// would hear of writes Noticed does not tell of yet, which no store
// does; the test that uses it has no call waiting in line, and so no
// Watch.
type trailingNotices struct {
	llmretrytest.MemoryStore

	mu        sync.Mutex
	prev, cur noticed // the last two states written, by version
	contended bool
	lost      int // compare-and-swaps lost while contended
}

func (s *trailingNotices) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	ok, err := s.MemoryStore.CompareAndSwap(ctx, key, version, next)
	s.mu.Lock()
	if ok {
		s.prev, s.cur = s.cur, noticed{bytes.Clone(next), version + 1}
	}
	contended := s.contended
	if !ok && err == nil && contended {
		s.lost++
	}
	s.mu.Unlock()
	if !ok && err == nil && contended {
		s.writeByAnother(key)
	}
	return ok, err
}

// writeByAnother is another process's write of key: it writes the state
// back as it found it, so that only the version moves. It reports
// whether the write landed.
func (s *trailingNotices) writeByAnother(key string) bool {
	data, ver, err := s.MemoryStore.Load(context.Background(), key)
	if err != nil {
		panic(err) // the store does not fail in these tests
	}
	ok, err := s.CompareAndSwap(context.Background(), key, ver, data)
	return ok && err == nil
}

func (s *trailingNotices) Noticed(key string) ([]byte, int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prev.ver == 0 {
		return nil, 0, false
	}
	return bytes.Clone(s.prev.state), s.prev.ver, true
}

// A process whose compare-and-swap loses twice loads the state before
// it tries again: under contention the notices may trail the store, each
// newer than the view but older than the state, and a process that went
// on deciding on them would lose every time, until its store's time ran
// out, and then decide on its own, its request not counted by the fleet.
// Here another process's write that no notice told of makes the first
// write lose; the notice of it, which the second try decides on, is
// already one write behind, and so is every later one; the third try
// reads the store, and its write lands.
func TestFleetLoadsAfterASecondLostWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &trailingNotices{}
		store.Latency = 2 * ms
		br := &llmretry.Breaker{Store: store, Key: "k"}
		c := &chain{Backends: []backend{{Model: "a", Call: reportingCall(func(string) time.Duration { return sec }), Breaker: br}}}
		if _, err := c.Do(t.Context(), "warm"); err != nil {
			t.Fatal(err)
		}
		if !store.writeByAnother("k") {
			t.Fatal("the other process's write did not land")
		}
		store.mu.Lock()
		store.contended = true
		store.mu.Unlock()
		if got, err := c.Do(t.Context(), "x"); got != "x" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "x")
		}
		if st := br.State(); st.StoreErrors != 0 {
			t.Errorf("State().StoreErrors = %d (%v), want 0", st.StoreErrors, st.StoreErr)
		}
		if diff := cmp.Diff(tally{Admitted: 2, Back: 2}, storedTally(t, &store.MemoryStore, "k")); diff != "" {
			t.Errorf("stored counts (-want +got):\n%s", diff)
		}
		store.mu.Lock()
		defer store.mu.Unlock()
		if store.lost != 2 {
			t.Errorf("%d compare-and-swaps lost, want 2: lost on the view, lost on the trailing notice, then read and written", store.lost)
		}
	})
}
