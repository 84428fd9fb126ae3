package pgbreaker

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
)

// Store is an [llmretry.BreakerStore] on PostgreSQL: one row per
// backend key in the table [Migrate] creates, written by
// compare-and-swap on its version, with LISTEN/NOTIFY to wake the
// Breakers of every process that watch a key. Create one with [New] and
// end it with [Store.Close]; the zero Store is not usable. It is safe for
// concurrent use: one Store per process serves all its Breakers.
type Store struct {
	pool *pgxpool.Pool
	l    *listener
}

// New returns a store that runs its statements on pool's connections,
// and listens for other processes' changes on one connection of its
// own, made with pool's settings. It does not connect before it returns:
// a database that is down makes the Breaker's store calls fail, which it
// counts, not New. Run [Migrate] first, once, so that the table exists.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, l: newListener(pool.Config().ConnConfig, keepalive, pingTimeout)}
}

// Close stops listening, closes its connection and every channel that
// [Store.Watch] returned. It does not close the pool, which is the
// caller's. Call it once, after the Breakers that use the store are done
// with it; Load and CompareAndSwap still run after it, Watch fails.
func (s *Store) Close() { s.l.close() }

// Load returns the state stored for key, as the bytes written, and its
// version: nil and version 0 when the key has no row. It runs one
// SELECT, bounded by ctx; an error is the database's, wrapped.
func (s *Store) Load(ctx context.Context, key string) ([]byte, int64, error) {
	version, state, err := load(ctx, s.pool, key)
	if err != nil {
		return nil, 0, fmt.Errorf("pgbreaker: load %q: %w", key, err)
	}
	if version == 0 {
		return nil, 0, nil
	}
	if state == nil {
		state = []byte{} // a row holds bytes, if none: only no row is nil
	}
	return state, version, nil
}

// CompareAndSwap stores next for key, as version+1, only if the row is
// still at version (0: there is no row yet), and then notifies every
// listening process, all in one statement bounded by ctx. It reports
// false, with a nil error, when another write came first. An error is the
// database's, wrapped: the write may or may not have happened (a timeout
// can come after the commit), which the Breaker's next Load tells. It
// keeps no reference to next.
func (s *Store) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if next == nil {
		next = []byte{} // pgx sends a nil slice as NULL, and the column holds bytes
	}
	ok, err := swap(ctx, s.pool, key, version, next)
	if err != nil {
		return false, fmt.Errorf("pgbreaker: swap %q: %w", key, err)
	}
	return ok, nil
}

// errClosed is Watch's error after Close.
var errClosed = errors.New("pgbreaker: store is closed")

// Watch returns a channel that receives a value soon after any process
// changes key's row, and whenever a change may have gone unheard (the
// listening connection was lost and is back), until ctx is done or the
// store is closed; then the channel is closed. It holds one value: a
// value waiting unread stands for every change since. Watch itself runs
// no statement; it fails only after [Store.Close].
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	ch, ok := s.l.watch(ctx, key)
	if !ok {
		return nil, errClosed
	}
	return ch, nil
}

// The store must keep to the seam the core calls.
var _ llmretry.BreakerStore = (*Store)(nil)
