package llmretrytest_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The MemoryStore keeps the contract every store must.
func TestMemoryStoreConformance(t *testing.T) {
	llmretrytest.TestBreakerStore(t, "mem", func() llmretry.BreakerStore { return &llmretrytest.MemoryStore{} })
}

// A failing store fails every call until Fail(nil), and keeps what it
// stored; a call whose context ends within the Latency returns its error
// and writes nothing; Calls counts every call.
func TestMemoryStoreFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		m := &llmretrytest.MemoryStore{Latency: 10 * time.Millisecond}
		m.CompareAndSwap(ctx, "k", 0, []byte("one"))
		down := errors.New("down")
		m.Fail(down)
		if _, _, err := m.Load(ctx, "k"); !errors.Is(err, down) {
			t.Errorf("Load() error = %v, want %v", err, down)
		}
		if _, err := m.CompareAndSwap(ctx, "k", 1, []byte("two")); !errors.Is(err, down) {
			t.Errorf("CompareAndSwap() error = %v, want %v", err, down)
		}
		if _, err := m.Watch(ctx, "k"); !errors.Is(err, down) {
			t.Errorf("Watch() error = %v, want %v", err, down)
		}
		m.Fail(nil)
		short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		defer cancel()
		if ok, err := m.CompareAndSwap(short, "k", 1, []byte("three")); ok || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("CompareAndSwap() past its deadline = %v, %v, want false, context.DeadlineExceeded", ok, err)
		}
		start := time.Now()
		st, ver, err := m.Load(ctx, "k")
		if err != nil || ver != 1 || string(st) != "one" {
			t.Errorf("Load() = %q, %d, %v, want the state stored before the failure, version 1", st, ver, err)
		}
		if took := time.Since(start).Round(time.Microsecond); took != m.Latency {
			t.Errorf("Load() took %v, want the Latency, %v", took, m.Latency)
		}
		if got, want := m.Calls(), (llmretrytest.StoreCalls{Loads: 2, Swaps: 3, Watches: 1}); got != want {
			t.Errorf("Calls() = %+v, want %+v", got, want)
		}
	})
}
