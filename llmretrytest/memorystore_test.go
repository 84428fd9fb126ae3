package llmretrytest_test

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

// A compare-and-swap writes only at the version last read; a key never
// written is at version 0 and loads the zero state.
func TestMemoryStoreCompareAndSwap(t *testing.T) {
	ctx := context.Background()
	var m llmretrytest.MemoryStore
	st, ver, err := m.Load(ctx, "k")
	if err != nil || ver != 0 || !cmp.Equal(st, llmretry.SharedState{}) {
		t.Fatalf("Load() = %+v, %d, %v, want the zero state, 0, nil", st, ver, err)
	}
	next := llmretry.SharedState{Format: llmretry.SharedFormat, Failures: 2}
	if ok, err := m.CompareAndSwap(ctx, "k", 0, next); !ok || err != nil {
		t.Fatalf("CompareAndSwap(0) = %v, %v, want true, nil", ok, err)
	}
	if ok, err := m.CompareAndSwap(ctx, "k", 0, llmretry.SharedState{Failures: 9}); ok || err != nil {
		t.Fatalf("CompareAndSwap(0) again = %v, %v, want false, nil: the version moved", ok, err)
	}
	st, ver, err = m.Load(ctx, "k")
	if err != nil || ver != 1 || !cmp.Equal(st, next) {
		t.Fatalf("Load() = %+v, %d, %v, want %+v, 1, nil", st, ver, err, next)
	}
	if _, ver, _ := m.Load(ctx, "other"); ver != 0 {
		t.Errorf("Load(other) version = %d, want 0: keys are apart", ver)
	}
	if got, want := m.Calls(), (llmretrytest.StoreCalls{Loads: 3, Swaps: 2}); got != want {
		t.Errorf("Calls() = %+v, want %+v", got, want)
	}
}

// Watch hears every change of its key, and is closed when its context
// ends.
func TestMemoryStoreWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var m llmretrytest.MemoryStore
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := m.Watch(ctx, "k")
		if err != nil || ch == nil {
			t.Fatalf("Watch() = %v, %v, want a channel", ch, err)
		}
		m.CompareAndSwap(context.Background(), "other", 0, llmretry.SharedState{})
		synctest.Wait()
		select {
		case <-ch:
			t.Fatal("Watch(k) heard a change of another key")
		default:
		}
		m.CompareAndSwap(context.Background(), "k", 0, llmretry.SharedState{})
		if _, ok := <-ch; !ok {
			t.Fatal("Watch(k) closed, want a change")
		}
		cancel()
		if _, ok := <-ch; ok {
			t.Fatal("Watch(k) sent after its context ended, want it closed")
		}
	})
}

// A failing store fails every call until Fail(nil), and keeps what it
// stored; a call whose context ends within the Latency returns its error
// and writes nothing.
func TestMemoryStoreFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		m := &llmretrytest.MemoryStore{Latency: 10 * time.Millisecond}
		m.CompareAndSwap(ctx, "k", 0, llmretry.SharedState{Failures: 1})
		down := errors.New("down")
		m.Fail(down)
		if _, _, err := m.Load(ctx, "k"); !errors.Is(err, down) {
			t.Errorf("Load() error = %v, want %v", err, down)
		}
		if _, err := m.CompareAndSwap(ctx, "k", 1, llmretry.SharedState{}); !errors.Is(err, down) {
			t.Errorf("CompareAndSwap() error = %v, want %v", err, down)
		}
		if _, err := m.Watch(ctx, "k"); !errors.Is(err, down) {
			t.Errorf("Watch() error = %v, want %v", err, down)
		}
		m.Fail(nil)
		short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		defer cancel()
		if ok, err := m.CompareAndSwap(short, "k", 1, llmretry.SharedState{Failures: 7}); ok || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("CompareAndSwap() past its deadline = %v, %v, want false, context.DeadlineExceeded", ok, err)
		}
		start := time.Now()
		st, ver, err := m.Load(ctx, "k")
		if err != nil || ver != 1 || st.Failures != 1 {
			t.Errorf("Load() = %+v, %d, %v, want the state stored before the failure, version 1", st, ver, err)
		}
		if took := time.Since(start); took != m.Latency {
			t.Errorf("Load() took %v, want the Latency, %v", took, m.Latency)
		}
	})
}
