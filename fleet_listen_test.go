package llmretry_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The test in this file holds a waiting line to a load rule that only a
// store whose notices carry no state can show: with notices that carry
// it (fleet_notice_test.go), the newest notice says what changed.

// batchedNotices is a MemoryStore whose Watch tells of the changes of a
// period in one notice, as a store that polls a change feed does: after
// a change it waits period, and then sends one value for every change
// since.
//
// A MemoryStore alone never merges two notices in virtual time: each
// write's notice comes at an instant of its own, and the Breaker's
// watch is back at its channel before the clock moves on, so it hears
// of every write apart.
type batchedNotices struct {
	llmretrytest.MemoryStore
	period time.Duration
}

func (s *batchedNotices) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	in, err := s.MemoryStore.Watch(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		for range in {
			if !sleepCtx(ctx, s.period) {
				return
			}
			// The changes of the period wait in in's one slot: this
			// notice tells of them too.
			select {
			case <-in:
			default:
			}
			select {
			case out <- struct{}{}:
			default: // one is pending already, and tells of these
			}
		}
	}()
	return out, nil
}

// A line that waits for another process's probe loads the state on
// every notice, even one that may be of its own write: a notice can
// stand for several changes, and one that stands for this process's
// write and the probe's outcome together, if taken for the write alone,
// leaves the line waiting on a view with the probe still in flight,
// until the probe's lease runs out. Here process A has two calls waiting
// while B's probe is in flight; as the probe answers, A's first call
// gives up, and A's write of its line and B's write closing the breaker
// come as one notice. A's other call goes at once, not two minutes later.
func TestFleetListeningLineReadsOnEveryNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = 10 * ms
		store := &batchedNotices{period: period}
		store.StatelessNotices = true // a notice that carried the state would say what changed
		procA := &llmretry.Breaker{Store: store, Key: "k"}
		procB := &llmretry.Breaker{Store: store, Key: "k"}
		tripFor(t, procB, 30*sec) // open until 30 s, when B's probe goes
		d := newDesk("a", takes(5*sec))
		inA := &chain{Backends: []backend{{Model: "a", Call: d.Call, Breaker: procA}}}
		inB := &chain{Backends: []backend{{Model: "a", Call: d.Call, Breaker: procB}}}
		d.start = time.Now()
		probe := doAt(t.Context(), inB, 30*sec, "probe") // answers at 35 s
		lctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		leaves := doAt(lctx, inA, 31*sec, "leaves")
		waits := doAt(t.Context(), inA, 32*sec, "waits")
		time.Sleep(35 * sec)
		cancel()
		if r := <-leaves; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("the call that gives up: Do() = %q, %v, want context.Canceled", r.resp, r.err)
		}
		for _, o := range []<-chan outcome{probe, waits} {
			if r := <-o; r.err != nil {
				t.Fatalf("Do() = %q, %v, want an answer", r.resp, r.err)
			}
		}
		// Sent once the notice of both writes comes. Taken for A's own
		// write, the call goes only when B's probe lease (2 min) runs out
		// on A's view, at 2m30s.
		want := []sent{{30 * sec, "probe"}, {35*sec + period, "waits"}}
		if diff := cmp.Diff(want, d.log()); diff != "" {
			t.Errorf("requests to the backend (-want +got):\n%s", diff)
		}
	})
}
