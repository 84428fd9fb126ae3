package llmretrytest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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
	// database would, on the caller's clock (fake in a synctest bubble),
	// and a nanosecond more, in which the calls due at that instant are
	// gathered and carried out in an order of the store's own (see
	// apply); a call whose context ends first returns the context's
	// error, and a compare-and-swap so cut short writes nothing. 0 means
	// none.
	Latency time.Duration

	// StatelessNotices makes the store's notices carry no state, as
	// those of a store that is not an [llmretry.StateNotifier]: Noticed
	// then reports none, and a Breaker loads the state after each change
	// it hears of. It stands for such a store in tests and benchmarks.
	StatelessNotices bool

	mu       sync.Mutex
	rows     map[string]row
	noticed  map[string]row // the state each key's newest notice carried
	watchers map[string]map[chan struct{}]struct{}
	err      error // what every call returns, from Fail; nil: serve
	calls    StoreCalls
	due      []*storeOp // calls waiting to be carried out at this instant
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
	op := &storeOp{key: key, load: true}
	m.apply(op)
	return op.state, op.version, op.err
}

// CompareAndSwap stores a copy of next for key, as version+1, when its
// version is still version, and tells every Watch of key.
func (m *MemoryStore) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	m.count(&m.calls.Swaps)
	if err := m.wait(ctx); err != nil {
		return false, err
	}
	op := &storeOp{key: key, version: version, state: bytes.Clone(next)}
	m.apply(op)
	return op.ok, op.err
}

// storeOp is a Load or a CompareAndSwap due at one instant, and its
// answer.
type storeOp struct {
	key     string
	load    bool
	version int64
	state   []byte
	ok      bool
	err     error
	done    bool
}

// apply carries op out with every other call due at the same instant,
// in an order of their own rather than the goroutines': for each key the
// writes first, in order of their bytes, then the reads, which see them.
// So a fleet played in virtual time writes and reads alike on every
// replay. (In real time the calls of an instant are those a nanosecond's
// wait gathers.)
func (m *MemoryStore) apply(op *storeOp) {
	m.mu.Lock()
	m.due = append(m.due, op)
	m.mu.Unlock()
	time.Sleep(time.Nanosecond)
	m.mu.Lock()
	defer m.mu.Unlock()
	if op.done {
		return
	}
	due := m.due
	m.due = nil
	slices.SortStableFunc(due, func(a, b *storeOp) int {
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		if a.load != b.load {
			if b.load {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.version, b.version); c != 0 {
			return c
		}
		return bytes.Compare(a.state, b.state)
	})
	for _, o := range due {
		m.do(o)
		o.done = true
	}
}

// do carries out one call; m.mu is held.
func (m *MemoryStore) do(op *storeOp) {
	if m.err != nil {
		op.err = m.err
		return
	}
	r := m.rows[op.key]
	if op.load {
		op.state, op.version = bytes.Clone(r.state), r.version
		return
	}
	if r.version != op.version {
		return
	}
	if m.rows == nil {
		m.rows = make(map[string]row)
	}
	m.rows[op.key] = row{state: op.state, version: op.version + 1}
	op.ok = true
	// The watchers hear of it a nanosecond on, after the answers of this
	// instant: which of the two a caller saw first must not depend on the
	// goroutines' order.
	watchers := slices.Collect(maps.Keys(m.watchers[op.key]))
	notice := row{state: op.state, version: op.version + 1}
	time.AfterFunc(time.Nanosecond, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.noticed == nil {
			m.noticed = make(map[string]row)
		}
		if notice.version > m.noticed[op.key].version {
			m.noticed[op.key] = notice
		}
		for _, ch := range watchers {
			if _, ok := m.watchers[op.key][ch]; !ok {
				continue // its watch ended: the channel is closed
			}
			select {
			case ch <- struct{}{}:
			default: // a change is pending already: one is as good as two
			}
		}
	})
}

// Noticed returns the state of key that the newest notice of a change
// carried, and its version: MemoryStore's notices carry the state they
// announce, as pgbreaker's do (see [llmretry.StateNotifier]), and a
// notice is made of every change, watched or not, a nanosecond after it.
// While the store fails (Fail), and with StatelessNotices, it reports
// none.
func (m *MemoryStore) Noticed(key string) (state []byte, version int64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil || m.StatelessNotices {
		// A store that is down tells nothing: a Breaker then loads,
		// and learns that it fails.
		return nil, 0, false
	}
	r, ok := m.noticed[key]
	return bytes.Clone(r.state), r.version, ok
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
