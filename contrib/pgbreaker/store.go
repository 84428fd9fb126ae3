package pgbreaker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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
	pool         *pgxpool.Pool
	l            *listener
	loads, swaps batcher
}

// New returns a store that runs its statements on pool's connections,
// and listens for other processes' changes on one connection of its
// own, made with pool's settings. It does not connect before it returns:
// a database that is down makes the Breaker's store calls fail, which it
// counts, not New. Run [Migrate] first, once, so that the table exists.
func New(pool *pgxpool.Pool) *Store {
	return newStore(pool, keepalive, pingTimeout)
}

// newStore is New with the listening connection's keepalive and ping
// timeout.
func newStore(pool *pgxpool.Pool, keepalive, pingTimeout time.Duration) *Store {
	s := &Store{pool: pool, l: newListener(pool.Config().ConnConfig, keepalive, pingTimeout)}
	s.loads.run = func(ctx context.Context, calls []*call) { loadBatch(ctx, pool, calls) }
	s.swaps.run = func(ctx context.Context, calls []*call) { swapBatch(ctx, pool, calls) }
	s.swaps.distinct = true
	return s
}

// Close stops listening, closes its connection and every channel that
// [Store.Watch] returned. It does not close the pool, which is the
// caller's. Call it once, after the Breakers that use the store are done
// with it; Load and CompareAndSwap still run after it, Watch fails.
func (s *Store) Close() { s.l.close() }

// Load returns the state stored for key, as the bytes written, and its
// version: nil and version 0 when the key has no row. Its query is the
// one of every key being loaded at the time. It returns by the end of
// ctx; an error is the database's or ctx's, wrapped. A key that is not
// UTF-8, holds a NUL or is longer than 2,048 bytes is refused with an
// error before any statement runs: the row's key could not hold it.
func (s *Store) Load(ctx context.Context, key string) ([]byte, int64, error) {
	if err := checkKey(key); err != nil {
		return nil, 0, fmt.Errorf("pgbreaker: load %s: %w", quoteKey(key), err)
	}
	s.l.use(key)
	c := &call{key: key}
	if err := s.loads.do(ctx, c); err != nil {
		return nil, 0, fmt.Errorf("pgbreaker: load %s: %w", quoteKey(key), err)
	}
	if c.version == 0 {
		return nil, 0, nil
	}
	return c.state, c.version, nil
}

// CompareAndSwap stores next for key, as version+1, only if the row is
// still at version (0: there is no row yet), and then notifies every
// listening process; its statement is the one of every key being
// written at the time. It reports false, with a nil error, when another
// write came first. It returns by the end of ctx, and writes nothing if
// ctx is done before its statement is sent. An error is the database's
// or ctx's, wrapped: the write may or may not have happened (a timeout
// can come after the commit), which the Breaker's next Load tells. A key
// Load refuses, it refuses alike. It keeps no reference to next.
func (s *Store) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, fmt.Errorf("pgbreaker: swap %s: %w", quoteKey(key), err)
	}
	s.l.use(key)
	// A copy: the statement may run after the call returns, for the
	// other calls of its batch. (A nil slice would be sent as NULL.)
	c := &call{key: key, version: version, state: append([]byte{}, next...)}
	if err := s.swaps.do(ctx, c); err != nil {
		return false, fmt.Errorf("pgbreaker: swap %s: %w", quoteKey(key), err)
	}
	return c.ok, nil
}

// maxKey is the longest key a row can have, in bytes. The primary key's
// btree index holds an entry of at most a third of a page, less its
// headers: 2,704 bytes on 8 KB pages, where 2,688 bytes of hex went in
// and 2,720 did not. A key that compresses may be longer; a round bound
// below them all is the same on every server.
const maxKey = 2048

// checkKey says why key cannot be a row's key: PostgreSQL's text holds
// neither NUL nor bytes that are not UTF-8, its index no key longer than
// maxKey, and a key it refused would fail the statement of every other
// key of its batch. (Watch runs no statement, and does not check.)
func checkKey(key string) error {
	switch {
	case !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0:
		return errors.New("key is not text PostgreSQL can hold (NUL or invalid UTF-8)")
	case len(key) > maxKey:
		return fmt.Errorf("key is %d bytes, more than the %d bytes a key may be", len(key), maxKey)
	}
	return nil
}

// quoteKey quotes key for an error, its first 64 bytes and an ellipsis
// when it is longer: an error about a key too long to store is not
// made as long.
func quoteKey(key string) string {
	const most = 64
	if len(key) <= most {
		return strconv.Quote(key)
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	return strconv.Quote(key[:cut]) + "…"
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
	s.l.use(key)
	ch, ok := s.l.watch(ctx, key)
	if !ok {
		return nil, errClosed
	}
	return ch, nil
}

// Noticed returns the state of key that the newest notice of a change
// carried, and its version, without a statement, making the store an
// [llmretry.StateNotifier]: each write's notice carries the row, unless
// it is too big for a NOTIFY (about 5.9 KB of state, less the key's
// bytes). ok is false until
// a notice of key comes after the store's first call with key, after a
// notice that carried no state, and from the moment the listening
// connection is found lost until a notice comes on the next one. A
// connection that dies without a word is found lost within the keepalive
// and the ping's timeout (35 s): until then a Breaker's decisions that
// write nothing are made on the last state noticed; one that writes is
// checked by its compare-and-swap. The store keeps the newest state of
// each key it was called with, for as long as it runs.
func (s *Store) Noticed(key string) (state []byte, version int64, ok bool) {
	return s.l.noticedOf(key)
}

// The store must keep to the seam the core calls, notices included.
var _ llmretry.StateNotifier = (*Store)(nil)
