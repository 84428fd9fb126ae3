package pgbreaker_test

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
)

// errorsStore counts the calls and the errors of the store under it, by
// their text, so that a test can say why calls failed.
type errorsStore struct {
	llmretry.BreakerStore
	calls, failed atomic.Int64
	mu            sync.Mutex
	errs          map[string]int
}

// Noticed passes the store's notices through (see countingStore).
func (s *errorsStore) Noticed(key string) ([]byte, int64, bool) {
	return noticedOf(s.BreakerStore, key)
}

func (s *errorsStore) note(err error) {
	s.calls.Add(1)
	if err == nil {
		return
	}
	s.failed.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.errs == nil {
		s.errs = make(map[string]int)
	}
	s.errs[errClass(err)]++
}

func (s *errorsStore) Load(ctx context.Context, key string) ([]byte, int64, error) {
	st, v, err := s.BreakerStore.Load(ctx, key)
	s.note(err)
	return st, v, err
}

func (s *errorsStore) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	ok, err := s.BreakerStore.CompareAndSwap(ctx, key, version, next)
	s.note(err)
	return ok, err
}

// errClass is an error's text without the key it names.
func errClass(err error) string {
	return keyRE.ReplaceAllString(err.Error(), "KEY")
}

var keyRE = regexp.MustCompile(`"many/[0-9]+"`)

// manyKeysStoreTimeout is the Breakers' StoreTimeout in TestManyKeys.
// It is not the default, 100 ms, because on this machine's two cores,
// shared with other work, a thousand decisions at once leave the store
// little of it: the core's own work for them took up to 94 ms of a
// decision's bound before it called CompareAndSwap, and about one run
// in ten then failed a few hundred calls, though the store's statements
// took 1 to 30 ms. At 250 ms this test passes with the store's batches
// and fails with one statement per call (804 to 4,848 failed calls in
// three runs), which is what it is for. The race detector made the run
// 15 to 20 times slower (0.3 s to 5 to 7 s), and a one-key statement
// took 200 to 330 ms inside the process: there the bound is 5 s, and
// the test checks only that every key gets its row without error.
var manyKeysStoreTimeout = map[bool]time.Duration{false: 250 * time.Millisecond, true: 5 * time.Second}[raceEnabled]

// warm makes pool's connections, up to its size.
func warm(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, pool.Config().MaxConns)
	for range cap(conns) {
		c, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatalf("Acquire() = %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// A thousand backends, each its own Breaker and key, on one Store whose
// pool has its default size, all deciding at once on a healthy server:
// no store call fails, and every key gets its row. Not in parallel with
// the other tests: it measures what one process asks of the database,
// on a machine of two cores.
func TestManyKeys(t *testing.T) {
	const keys, callsEach = 1000, 3
	s, pool := newStore(t, freshSchema(t, pgURL(t), "pgbreaker_many_keys"))
	// The pool's connections made before the calls, as a process that
	// has been up a while has them: on this loaded machine making one
	// takes tens of milliseconds, and the first decisions, which wait
	// for it, are bound by StoreTimeout (100 ms by default).
	warm(t, pool)
	es := &errorsStore{BreakerStore: s}
	ok := func(context.Context, string) (string, error) { return "ok", nil }
	breakers := make([]*llmretry.Breaker, keys)
	var wg sync.WaitGroup
	errs := make([]error, keys)
	start := time.Now()
	for i := range breakers {
		b := &llmretry.Breaker{Store: es, Key: "many/" + strconv.Itoa(i), StoreTimeout: manyKeysStoreTimeout}
		breakers[i] = b
		c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{Model: model, Call: ok, Breaker: b}}}
		wg.Go(func() {
			for range callsEach {
				if _, err := c.Do(t.Context(), "hi"); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d keys × %d calls in %v; pool max %d conns; store calls %d, failed %d", keys, callsEach, time.Since(start), pool.Config().MaxConns, es.calls.Load(), es.failed.Load())
	ps := pool.Stat()
	t.Logf("pool: acquires %d, of which waited %d (%v in all), cancelled while waiting %d; connections made %d, destroyed %d",
		ps.AcquireCount(), ps.EmptyAcquireCount(), ps.EmptyAcquireWaitTime(), ps.CanceledAcquireCount(), ps.NewConnsCount(), ps.MaxLifetimeDestroyCount()+ps.MaxIdleDestroyCount())
	var classes []string
	for e, n := range es.errs {
		classes = append(classes, fmt.Sprintf("%6d %s", n, e))
	}
	sort.Strings(classes)
	for _, c := range classes {
		t.Log(c)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("key %d: Do() = %v", i, err)
		}
	}
	var storeErrors int64
	for _, b := range breakers {
		storeErrors += b.State().StoreErrors
	}
	if storeErrors != 0 || es.failed.Load() != 0 {
		t.Errorf("store errors: %d counted by the Breakers, %d of %d store calls failed; want none", storeErrors, es.failed.Load(), es.calls.Load())
	}
	var rows int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM llmretry_breaker WHERE key LIKE 'many/%'`).Scan(&rows); err != nil || rows != keys {
		t.Errorf("rows = %d, %v; want %d: one per key", rows, err, keys)
	}
}
