package llmretry_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The tests in this file play a fleet inside one process: each Breaker
// stands for one process's, and the Breakers of one test share a
// llmretrytest.MemoryStore, as processes would share a database. A Breaker
// with share false has no store: what the fleet would do without one.

// fleet is n Breakers of one backend, sharing one store when share is
// set.
func fleet(n int, share bool, store *llmretrytest.MemoryStore) []*llmretry.Breaker {
	brs := make([]*llmretry.Breaker, n)
	for i := range brs {
		brs[i] = &llmretry.Breaker{}
		if share {
			brs[i].Store, brs[i].Key = store, "openai/gpt-4o"
		}
	}
	return brs
}

var errDown = llmretry.StatusFailure(503, nil, errors.New("down"))

// Five failures seen by two processes, three by one and two by the
// other, open the backend for both when they share a store: the next
// call of either skips it. Apart, neither has counted five.
func TestSharedBreakerOpensForTheFleet(t *testing.T) {
	tests := []struct {
		name     string
		share    bool
		wantSent int // to the primary: five failures, then the skips send nothing
	}{
		{name: "shared", share: true, wantSent: 5},
		{name: "apart", share: false, wantSent: 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				brs := fleet(2, tc.share, &llmretrytest.MemoryStore{Latency: 2 * ms})
				a := newDesk("a", func(int) (time.Duration, error) { return 100 * ms, errDown })
				b := newDesk("b", takes(100*ms))
				chains := make([]*chain, 2)
				for i, br := range brs {
					chains[i] = &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}
				}
				for i, p := range []int{0, 1, 0, 1, 0, 1, 0} {
					if got, err := chains[p].Do(t.Context(), "r"); got != "b: r" || err != nil {
						t.Fatalf("call %d: Do() = %q, %v, want %q, nil", i, got, err, "b: r")
					}
				}
				if got := len(a.log()); got != tc.wantSent {
					t.Errorf("the primary got %d requests, want %d", got, tc.wantSent)
				}
				if !tc.share {
					return
				}
				for i, br := range brs {
					st := br.State()
					if !st.Open || st.Failures != 5 || st.Opened != 1 || st.StoreErrors != 0 {
						t.Errorf("breaker %d: State() = %+v, want open after 5 failures, opened once, no store errors", i, st)
					}
				}
			})
		})
	}
}

// Half-open, one probe goes through for the whole fleet: the other
// process's call skips while it is in flight, and the probe's success
// closes the backend for both.
func TestSharedBreakerOneProbe(t *testing.T) {
	tests := []struct {
		name     string
		share    bool
		wantSent []sent // to the primary after the trip
	}{
		// Each probe costs a write (2 ms), and no load: the store's
		// notices told each process the state.
		{name: "shared", share: true, wantSent: []sent{{30*sec + 2*ms, "p0"}, {45*sec + 2*ms, "p1-later"}}},
		{name: "apart", share: false, wantSent: []sent{{30 * sec, "p0"}, {31 * sec, "p1"}, {45 * sec, "p1-later"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &llmretrytest.MemoryStore{Latency: 2 * ms}
				brs := fleet(2, tc.share, store)
				trip(t, brs[0], errDown)
				if !tc.share {
					trip(t, brs[1], errDown)
				}
				a := newDesk("a", takes(10*sec)) // the probe answers, slowly
				b := newDesk("b", takes(100*ms))
				chains := make([]*chain, 2)
				for i, br := range brs {
					chains[i] = &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}
				}
				start := time.Now()
				a.start = start
				o0 := doAt(t.Context(), chains[0], 30*sec, "p0")
				o1 := doAt(t.Context(), chains[1], 31*sec, "p1")
				o2 := doAt(t.Context(), chains[1], 45*sec, "p1-later")
				for _, o := range []<-chan outcome{o0, o1, o2} {
					if r := <-o; r.err != nil {
						t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
					}
				}
				if diff := cmp.Diff(tc.wantSent, a.log()); diff != "" {
					t.Errorf("requests to the primary (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A probe whose process never says how it went (it died, or hangs)
// holds the half-open backend only for ProbeLease: after it, another
// process probes.
func TestSharedBreakerProbeLeaseExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &llmretrytest.MemoryStore{}
		brs := fleet(2, true, store)
		for _, br := range brs {
			br.ProbeLease = time.Minute
		}
		trip(t, brs[0], errDown)
		hung, release := context.WithCancel(t.Context())
		a := newDesk("a", takes(0))
		hang := func(ctx context.Context, req string) (string, error) {
			a.Call(ctx, req)
			<-hung.Done() // the probe never comes back while the test looks
			return "", context.Canceled
		}
		b := newDesk("b", takes(100*ms))
		c0 := &chain{Backends: []backend{{Model: "a", Call: hang, Breaker: brs[0]}}}
		c1 := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: brs[1]}, {Model: "b", Call: b.Call}}}
		start := time.Now()
		a.start = start
		o0 := doAt(context.Background(), c0, 30*sec, "dies")
		o1 := doAt(t.Context(), c1, 60*sec, "skips")     // the lease holds until 90s
		o2 := doAt(t.Context(), c1, 91*sec, "probes")    // it ran out
		o3 := doAt(t.Context(), c1, 100*sec, "answered") // the probe closed it
		for _, o := range []<-chan outcome{o1, o2, o3} {
			if r := <-o; r.err != nil {
				t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
			}
		}
		release()
		<-o0
		want := []sent{{30 * sec, "dies"}, {91 * sec, "probes"}, {100 * sec, "answered"}}
		if diff := cmp.Diff(want, a.log()); diff != "" {
			t.Errorf("requests to the primary (-want +got):\n%s", diff)
		}
		if st := brs[1].State(); st.Open || st.Probing {
			t.Errorf("State() = %+v, want closed", st)
		}
	})
}

// The pacing count S is the fleet's: a report one process got, and the
// requests the other let through since, hold back a call, here the
// fourth: two requests were left and the provider admits one more once T
// has come. Apart, the second process has no report and the first
// counts none of its requests: all go.
func TestSharedBreakerPacingCount(t *testing.T) {
	tests := []struct {
		name      string
		share     bool
		wantPaced bool // "b3" skips the primary, paced
	}{
		{name: "shared", share: true, wantPaced: true},
		{name: "apart", share: false, wantPaced: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				brs := fleet(2, tc.share, &llmretrytest.MemoryStore{Latency: 2 * ms})
				// Two requests left of ten, full again in 10 s: one more
				// every 1.25 s after the read.
				a := newDesk("a", takes(sec))
				primary := func(ctx context.Context, req string) (string, error) {
					llmretry.ReportLimits(ctx, limitHeader(10, 2, 10*sec))
					return a.Call(ctx, req)
				}
				b := newDesk("b", takes(100*ms))
				chains := make([]*chain, 2)
				for i, br := range brs {
					chains[i] = &chain{Backends: []backend{{Model: "a", Call: primary, Breaker: br}, {Model: "b", Call: b.Call}}}
				}
				a.start = time.Now()
				if _, err := chains[0].Do(t.Context(), "a1"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(sec) // T, 1.25 s after the report was read, has come
				outs := []<-chan outcome{
					doAt(t.Context(), chains[1], 0, "b1"),
					doAt(t.Context(), chains[1], 100*ms, "b2"),
					doAt(t.Context(), chains[0], 200*ms, "a2"),
					doAt(t.Context(), chains[1], 300*ms, "b3"), // R − S + 1 = 0
				}
				var got []string
				for _, o := range outs {
					r := <-o
					if r.err != nil {
						t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
					}
					got = append(got, r.resp)
				}
				want := []string{"a: b1", "a: b2", "a: a2", "a: b3"}
				if tc.wantPaced {
					want[3] = "b: b3"
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("answers (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A store that fails, or answers later than StoreTimeout, fails no call:
// the Breaker decides from its own state (here it opens after five
// failures, as a Breaker alone would), counts each failed decision, and
// shows it in BreakerState. When the store serves again, what was
// decided meanwhile is written with the next decision: the fleet learns
// of the five failures, and its breaker is open.
func TestSharedBreakerStoreFails(t *testing.T) {
	errStore := errors.New("connection refused")
	tests := []struct {
		name    string
		store   *llmretrytest.MemoryStore
		wantErr error
		took    time.Duration // what each decision's store calls take
	}{
		{name: "error", store: &llmretrytest.MemoryStore{Latency: 2 * ms}, wantErr: errStore, took: 2 * ms},
		{name: "slow", store: &llmretrytest.MemoryStore{Latency: time.Hour}, wantErr: context.DeadlineExceeded, took: llmretry.DefaultStoreTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				if tc.name == "error" {
					tc.store.Fail(errStore)
				}
				br := &llmretry.Breaker{Store: tc.store, Key: "k"}
				a := newDesk("a", takes(sec, errDown, errDown, errDown, errDown, errDown))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
				for i := range 5 {
					start := time.Now()
					if _, err := c.Do(t.Context(), "r"); err == nil {
						t.Fatalf("call %d: Do() = nil error, want the backend's failure", i)
					}
					// Two decisions (let through, then how it went), each
					// bounded by the store's failure.
					if took, want := time.Since(start).Round(time.Microsecond), sec+2*tc.took; took != want {
						t.Errorf("call %d: Do() took %v, want %v", i, took, want)
					}
				}
				st := br.State()
				want := llmretry.BreakerState{
					Open: true, Until: st.Until, Failures: 5, Kind: llmretry.KindTransient, Opened: 1,
					StoreErrors: 10, StoreUnavailable: true, StoreErr: tc.wantErr,
				}
				if diff := cmp.Diff(want, st, cmpopts.EquateErrors()); diff != "" {
					t.Errorf("State() (-want +got):\n%s", diff)
				}
				if tc.name != "error" {
					return
				}
				tc.store.Fail(nil)
				if _, err := c.Do(t.Context(), "r"); err == nil {
					t.Fatalf("Do() = nil error, want a skip: the fleet learned the failures")
				}
				if st := br.State(); st.StoreUnavailable || st.StoreErrors != 10 || !st.Open {
					t.Errorf("State() = %+v, want open, the store available again, 10 errors so far", st)
				}
				data, _, _ := tc.store.Load(t.Context(), "k")
				if st, err := llmretry.DecodeFleetState(data); err != nil || st.Failures != 5 || st.Until.IsZero() {
					t.Errorf("stored state = %+v, %v, want the five failures, open", st, err)
				}
			})
		})
	}
}

// A call waiting on the backend, its last, wakes when another process
// changes the state, as soon as the store tells it: here when the other
// process's probe answers, 5 s into the wait, not at the call's own
// bound.
func TestSharedBreakerWaiterWakesOnChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brs := fleet(2, true, &llmretrytest.MemoryStore{})
		tripFor(t, brs[0], 30*sec) // a hinted wait needs no retry waits
		a := newDesk("a", takes(5*sec))
		chains := make([]*chain, 2)
		for i, br := range brs {
			chains[i] = &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		}
		a.start = time.Now()
		probe := doAt(t.Context(), chains[0], 30*sec, "probe")
		waiter := doAt(t.Context(), chains[1], 31200*ms, "waits")
		for _, o := range []<-chan outcome{probe, waiter} {
			if r := <-o; r.err != nil {
				t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
			}
		}
		got := a.log()
		// Polling, the waiter would wake at 35.2 s.
		want := []sent{{30 * sec, "probe"}, {35 * sec, "waits"}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("requests to the primary (-want +got):\n%s", diff)
		}
	})
}

// A Breaker with a Store needs a Key, and no negative StoreTimeout or
// ProbeLease.
func TestSharedBreakerValidate(t *testing.T) {
	store := &llmretrytest.MemoryStore{}
	tests := []struct {
		name string
		br   *llmretry.Breaker
		want string // "" for valid
	}{
		{name: "keyed", br: &llmretry.Breaker{Store: store, Key: "k"}},
		{name: "no_key", br: &llmretry.Breaker{Store: store}, want: "llmretry: backend 0 (a): breaker store has no key"},
		{name: "negative_timeout", br: &llmretry.Breaker{Store: store, Key: "k", StoreTimeout: -ms}, want: "llmretry: backend 0 (a): breaker store timeout or probe lease is negative"},
		{name: "negative_lease", br: &llmretry.Breaker{Store: store, Key: "k", ProbeLease: -ms}, want: "llmretry: backend 0 (a): breaker store timeout or probe lease is negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &chain{Backends: []backend{{Model: "a", Call: newDesk("a", takes(0)).Call, Breaker: tc.br}}}
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			checkConfigErr(t, "Validate()", err, tc.want)
		})
	}
}

// The fleet's line decides who goes first: the call that began first,
// whichever process it is in. Two calls wait on a half-open backend,
// the earlier in the second process; it gets the probe even though the
// first process's call asked at the same instant.
func TestSharedBreakerFleetLine(t *testing.T) {
	tests := []struct {
		name  string
		share bool
		want  []sent
	}{
		{name: "shared", share: true, want: []sent{{30 * sec, "early"}, {35 * sec, "late"}}},
		// Apart, each process probes on its own.
		{name: "apart", share: false, want: []sent{{30 * sec, "early"}, {30 * sec, "late"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				brs := fleet(2, tc.share, &llmretrytest.MemoryStore{})
				tripFor(t, brs[0], 30*sec)
				if !tc.share {
					tripFor(t, brs[1], 30*sec)
				}
				a := newDesk("a", takes(5*sec))
				chains := make([]*chain, 2)
				for i, br := range brs {
					chains[i] = &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
				}
				a.start = time.Now()
				late := doAt(t.Context(), chains[0], 20*sec, "late")
				early := doAt(t.Context(), chains[1], 10*sec, "early")
				for _, o := range []<-chan outcome{late, early} {
					if r := <-o; r.err != nil {
						t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
					}
				}
				if diff := cmp.Diff(tc.want, a.log(), cmpopts.SortSlices(func(x, y sent) bool { return x.Req < y.Req })); diff != "" {
					t.Errorf("requests to the primary (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// oddStore is a store whose every compare-and-swap finds the state
// changed (busy), or whose state is of a format newer than this
// package's (newer).
type oddStore struct {
	llmretrytest.MemoryStore
	busy, newer bool
}

func (s *oddStore) Load(ctx context.Context, key string) ([]byte, int64, error) {
	st, ver, err := s.MemoryStore.Load(ctx, key)
	if s.newer {
		st = llmretry.NewerFormatState()
	}
	return st, ver, err
}

func (s *oddStore) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if s.busy {
		return false, nil
	}
	return s.MemoryStore.CompareAndSwap(ctx, key, version, next)
}

// A store that another process changes on every try, or that holds a
// state this package cannot read, is a failing store: the call goes
// through on the local state, and the failure is counted.
func TestSharedBreakerStoreCannotBeUsed(t *testing.T) {
	tests := []struct {
		name    string
		store   *oddStore
		errs    int64 // the letting through failed; how it went changed nothing to write when the store is busy
		down    bool
		wantErr string
	}{
		{name: "busy", store: &oddStore{busy: true}, errs: 2, down: false, wantErr: "llmretry: breaker store: the state changed on every try"},
		{name: "newer_format", store: &oddStore{newer: true}, errs: 2, down: true, wantErr: "llmretry: breaker store: state of a newer format: format 3, this package reads up to 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			br := &llmretry.Breaker{Store: tc.store, Key: "k"}
			c := &chain{Backends: []backend{{Model: "a", Call: newDesk("a", takes(0)).Call, Breaker: br}}}
			if got, err := c.Do(t.Context(), "r"); got != "a: r" || err != nil {
				t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: r")
			}
			st := br.State()
			if st.StoreErrors != tc.errs || st.StoreUnavailable != tc.down || st.StoreErr == nil || st.StoreErr.Error() != tc.wantErr {
				t.Errorf("State() = %+v, want %d store errors, unavailable %v, %q", st, tc.errs, tc.down, tc.wantErr)
			}
		})
	}
}

// lateReply is a store whose Load reads the state at once and answers
// reply later, as a database's answer travels back to its process: a
// change written meanwhile is not in the state it returns. Its Watch
// begins to watch only watch after it is called; its compare-and-swap
// takes no time.
type lateReply struct {
	llmretrytest.MemoryStore
	reply, watch time.Duration
}

func (s *lateReply) Load(ctx context.Context, key string) ([]byte, int64, error) {
	st, ver, err := s.MemoryStore.Load(ctx, key)
	if !sleepCtx(ctx, s.reply) {
		return nil, 0, ctx.Err()
	}
	return st, ver, err
}

func (s *lateReply) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if !sleepCtx(ctx, s.watch) {
		return nil, ctx.Err()
	}
	return s.MemoryStore.Watch(ctx, key)
}

// sleepCtx sleeps for d, and reports false when ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// otherProcess changes the state of key in store as another process of
// the fleet would, and fails the test when it cannot.
func otherProcess(t *testing.T, store *llmretrytest.MemoryStore, key string, change func(*llmretry.FleetState)) {
	t.Helper()
	st, ver, err := store.Load(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	next, err := llmretry.ChangeFleetState(st, change)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := store.CompareAndSwap(context.Background(), key, ver, next); !ok || err != nil {
		_, ver2, _ := store.Load(context.Background(), key)
		t.Fatalf("CompareAndSwap() = %v, %v, want true, nil (version %d, now %d)", ok, err, ver, ver2)
	}
}

// halfOpenElsewhere is a state in which another process's probe holds
// the backend half-open, after a hint, from start on.
func halfOpenElsewhere(start time.Time) func(*llmretry.FleetState) {
	return func(st *llmretry.FleetState) {
		*st = llmretry.FleetState{
			Failures: 1, Until: start.Add(-sec), Kind: llmretry.KindTransient, Hinted: true, Opened: 1,
			ProbeOwner: "other/1", ProbeUntil: start.Add(time.Minute),
		}
	}
}

// probeAnswered is the change of the process whose probe answered: the
// backend is closed.
func probeAnswered(st *llmretry.FleetState) {
	st.Failures, st.Until, st.Hinted, st.ProbeOwner, st.ProbeUntil = 0, time.Time{}, false, "", time.Time{}
}

// A change that another process makes while a waiting call cannot hear
// of it wakes the call all the same, as soon as it can tell: here the
// backend is half-open for another process's probe, which answers at
// probeAt, and the call, waiting for it within a 10 s bound, is sent at
// want, not at the bound.
func TestSharedBreakerWakeNotLost(t *testing.T) {
	tests := []struct {
		name    string
		watch   time.Duration // how long the store's Watch takes to begin
		nudgeAt time.Duration // when another process makes a change of no consequence; 0: none
		probeAt time.Duration
		want    time.Duration
	}{
		// The nudge wakes the call, whose load reads the state at 1 s and
		// answers 10 ms later; the probe's success lands in between. The
		// call looks again once its load is back.
		{name: "during_load", nudgeAt: sec, probeAt: 1005 * ms, want: 1020 * ms},
		// The call joins the line at 10 ms and starts the watch, which
		// begins at 30 ms; the probe's success lands before, after the
		// call's last load read the state. The call looks again once the
		// watch has begun.
		{name: "before_watch", watch: 20 * ms, probeAt: 25 * ms, want: 40 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const key = "openai/gpt-4o"
				// Notices without the state: the races are those of
				// loads and of the watch's start.
				store := &lateReply{reply: 10 * ms, watch: tc.watch}
				store.StatelessNotices = true
				start := time.Now()
				otherProcess(t, &store.MemoryStore, key, halfOpenElsewhere(start))
				a := newDesk("a", takes(0))
				retry := llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 10 * sec}
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: retry, Breaker: &llmretry.Breaker{Store: store, Key: key}}}}
				out := doAt(t.Context(), c, 0, "waits")
				if tc.nudgeAt > 0 {
					time.Sleep(tc.nudgeAt)
					otherProcess(t, &store.MemoryStore, key, func(*llmretry.FleetState) {})
				}
				time.Sleep(tc.probeAt - tc.nudgeAt)
				otherProcess(t, &store.MemoryStore, key, probeAnswered)
				if r := <-out; r.err != nil {
					t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
				}
				if diff := cmp.Diff([]sent{{tc.want, "waits"}}, a.log()); diff != "" {
					t.Errorf("requests (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// failOnce is a store whose first compare-and-swap that lets a request
// through, after the one that put it in line, fails without writing,
// as a database that timed out before the commit.
type failOnce struct {
	llmretrytest.MemoryStore
	failed bool
}

func (s *failOnce) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if st, _ := llmretry.DecodeFleetState(next); !s.failed && st.Admitted > 0 {
		s.failed = true
		return false, errors.New("connection reset")
	}
	return s.MemoryStore.CompareAndSwap(ctx, key, version, next)
}

// A call let through by a decision whose write failed leaves the fleet's
// line all the same, once it is done waiting: its place there, had it
// stayed, would stand ahead of every later call of the fleet for the
// whole ProbeLease, and hold the half-open probe and pacing's last
// request from them.
func TestSharedBreakerFailedWriteLeavesNoPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "openai/gpt-4o"
		store := &failOnce{}
		otherProcess(t, &store.MemoryStore, key, halfOpenElsewhere(time.Now()))
		a := newDesk("a", takes(0))
		retry := llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 10 * sec}
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: retry, Breaker: &llmretry.Breaker{Store: store, Key: key}}}}
		out := doAt(t.Context(), c, 0, "waits")
		time.Sleep(sec)
		otherProcess(t, &store.MemoryStore, key, probeAnswered)
		if r := <-out; r.err != nil {
			t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
		}
		data, _, err := store.Load(context.Background(), key)
		st, _ := llmretry.DecodeFleetState(data)
		if err != nil || !store.failed || st.Waiting != 0 {
			t.Errorf("after the call: %d waiting, %v (the write failed: %v), want no one in line", st.Waiting, err, store.failed)
		}
	})
}

// busyWhile is a store whose every compare-and-swap finds the state
// changed while busy is set, as one that other processes keep writing.
type busyWhile struct {
	llmretrytest.MemoryStore
	busy atomic.Bool
}

func (s *busyWhile) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if s.busy.Load() {
		return false, nil
	}
	return s.MemoryStore.CompareAndSwap(ctx, key, version, next)
}

// A call that gives up waiting while the store takes no write leaves
// the fleet's line with the Breaker's next decision that the store
// takes: here another call's.
func TestSharedBreakerLeaveWhileStoreBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "openai/gpt-4o"
		store := &busyWhile{}
		otherProcess(t, &store.MemoryStore, key, halfOpenElsewhere(time.Now()))
		a := newDesk("a", takes(0))
		retry := llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 10 * sec}
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: retry, Breaker: &llmretry.Breaker{Store: store, Key: key}}}}
		ctx, cancel := context.WithCancel(t.Context())
		quits := doAt(ctx, c, 0, "quits")
		time.Sleep(sec)
		store.busy.Store(true)
		cancel()
		if r := <-quits; r.err == nil {
			t.Fatalf("Do() = %q, nil, want an error", r.resp)
		}
		store.busy.Store(false)
		waits := doAt(t.Context(), c, sec, "waits")
		time.Sleep(2 * sec)
		otherProcess(t, &store.MemoryStore, key, probeAnswered)
		if r := <-waits; r.err != nil {
			t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
		}
		data, _, err := store.Load(context.Background(), key)
		st, _ := llmretry.DecodeFleetState(data)
		if err != nil || st.Waiting != 0 {
			t.Errorf("after the calls: %d waiting, %v, want no one in line", st.Waiting, err)
		}
	})
}
