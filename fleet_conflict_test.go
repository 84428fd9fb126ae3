package llmretry_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// trailingNotices is a MemoryStore under contention: its notices trail
// the writes by one, each telling of the state before the store's
// current one, and once contended, another process writes after each
// compare-and-swap that loses, so that the store has moved on again by
// the time the loser tries anew.
type trailingNotices struct {
	llmretrytest.MemoryStore

	mu        sync.Mutex
	prev, cur noticed // the last two states written, by version
	contended bool
}

func (s *trailingNotices) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	ok, err := s.MemoryStore.CompareAndSwap(ctx, key, version, next)
	s.mu.Lock()
	if ok {
		s.prev, s.cur = s.cur, noticed{bytes.Clone(next), version + 1}
	}
	contended := s.contended
	s.mu.Unlock()
	if !ok && err == nil && contended {
		s.writeByAnother(key)
	}
	return ok, err
}

// writeByAnother is another process's write of key: it writes the state
// back as it found it, so that only the version moves.
func (s *trailingNotices) writeByAnother(key string) {
	data, ver, err := s.MemoryStore.Load(context.Background(), key)
	if err != nil {
		panic(err) // the store does not fail in these tests
	}
	s.CompareAndSwap(context.Background(), key, ver, data)
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
		store.writeByAnother("k")
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
	})
}
