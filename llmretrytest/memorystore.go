package llmretrytest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"
)

// MemoryStore is a [llmretry.BreakerStore] kept in memory, for tests and
// benchmarks of Breakers that share their state: several Breakers of one
// process, standing for the processes of a fleet, share one MemoryStore
// as they would share a database. It keeps a copy of the bytes it is
// given and hands out copies, so no two Breakers ever share memory
// through it. Its zero value is an empty store, ready to use. It is safe
// for concurrent use.
//
// Latency is read without the lock: set it before first use.
type MemoryStore struct {
	// Latency is how long each call takes, as a round trip to a
	// database would, on the caller's clock (fake in a synctest bubble);
	// a call whose context ends first returns the context's error, and a
	// compare-and-swap so cut short writes nothing. 0 means none.
	Latency time.Duration

	mu       sync.Mutex
	rows     map[string]row
	watchers map[string]map[chan struct{}]struct{}
	err      error // what every call returns, from Fail; nil: serve
	calls    StoreCalls
}

// row is one key's state and version.
type row struct {
	state   []byte
	version int64
}

// StoreCalls counts the calls a [MemoryStore] served, whether they failed
// or not.
type StoreCalls struct {
	Loads, Swaps, Watches int64
}

// Fail makes every call from now on return err (after the Latency), and
// Fail(nil) makes the store serve again; what it stores is kept. It
// stands for a database that is down.
func (m *MemoryStore) Fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = err
}

// Calls returns how many calls of each method the store has had.
func (m *MemoryStore) Calls() StoreCalls {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// Load returns the state stored for key and its version; nil and
// version 0 when none is.
func (m *MemoryStore) Load(ctx context.Context, key string) ([]byte, int64, error) {
	m.count(&m.calls.Loads)
	if err := m.wait(ctx); err != nil {
		return nil, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, 0, m.err
	}
	r := m.rows[key]
	return bytes.Clone(r.state), r.version, nil
}

// CompareAndSwap stores a copy of next for key, as version+1, when its
// version is still version, and tells every Watch of key.
func (m *MemoryStore) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	m.count(&m.calls.Swaps)
	if err := m.wait(ctx); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return false, m.err
	}
	if m.rows[key].version != version {
		return false, nil
	}
	if m.rows == nil {
		m.rows = make(map[string]row)
	}
	m.rows[key] = row{state: bytes.Clone(next), version: version + 1}
	for ch := range m.watchers[key] {
		select {
		case ch <- struct{}{}:
		default: // a change is pending already: one is as good as two
		}
	}
	return true, nil
}

// Watch returns a channel that receives after each change of key's
// state, until ctx ends; then it is closed.
func (m *MemoryStore) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	m.count(&m.calls.Watches)
	if err := m.wait(ctx); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	ch := make(chan struct{}, 1)
	if m.watchers == nil {
		m.watchers = make(map[string]map[chan struct{}]struct{})
	}
	if m.watchers[key] == nil {
		m.watchers[key] = make(map[chan struct{}]struct{})
	}
	m.watchers[key][ch] = struct{}{}
	context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.watchers[key], ch)
		close(ch)
	})
	return ch, nil
}

// count adds one to a call counter.
func (m *MemoryStore) count(n *int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*n++
}

// wait takes the store's Latency, or until ctx ends.
func (m *MemoryStore) wait(ctx context.Context) error {
	if m.Latency <= 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("llmretrytest: %w", err)
		}
		return nil
	}
	t := time.NewTimer(m.Latency)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("llmretrytest: %w", ctx.Err())
	}
}
