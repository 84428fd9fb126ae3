package pgbreaker

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewKeepalive is New with the listening connection's keepalive and
// ping timeout set, so that a test sees a silent connection found out
// in a moment.
func NewKeepalive(pool *pgxpool.Pool, keepalive, pingTimeout time.Duration) *Store {
	return newStore(pool, keepalive, pingTimeout)
}

// Listening waits until s first listens (and has woken the watchers it
// had then), or ctx is done: only then is every write sure to be heard.
func Listening(ctx context.Context, s *Store) error {
	select {
	case <-s.l.heard:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The statements, for the test that the package docs quote them as
// they run.
var Statements = map[string]string{"lock": lockSQL, "schema": schemaSQL, "column": columnSQL, "convert": convertSQL, "load": loadSQL, "swap": swapSQL, "table": tableSQL}

// The key's check and how errors quote a key, for their tests.
var (
	CheckKey = checkKey
	QuoteKey = quoteKey
)

// MaxKey is the longest key a row can have, in bytes.
const MaxKey = maxKey
