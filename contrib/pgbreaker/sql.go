package pgbreaker

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements, written out whole so that the package docs can quote
// them and a DBA can read what runs. Each is one round trip.
const (
	// lockSQL serialises every Migrate of the database: two sessions
	// that create one table at once both find it missing, and the second
	// fails on the catalog's unique index (pg_type) instead of finding
	// it there. The lock is a transaction's, so it goes with the
	// transaction, also when the session dies. Its key is the ASCII
	// bytes of "llmretry" read as one big-endian bigint.
	lockSQL = `SELECT pg_advisory_xact_lock(7812731383617434745)`

	// schemaSQL creates the table; it is safe to run again. The version
	// counts the writes to a row, so that a write can say which state
	// it replaces (compare-and-swap); the state is the core's bytes, as
	// the core gave them.
	schemaSQL = `CREATE TABLE IF NOT EXISTS llmretry_breaker (
	key        text        PRIMARY KEY,
	version    bigint      NOT NULL,
	state      bytea       NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
)`

	// columnSQL reads the type of the state column of the table that
	// the statements reach (the first on the search_path): jsonb in a
	// table that an earlier version of this package made.
	columnSQL = `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'llmretry_breaker'::regclass AND attname = 'state' AND NOT attisdropped`

	// convertSQL turns an earlier table's JSON states into bytes: the
	// JSON text, which the core reads as a state of its first format and
	// starts afresh from, as from a new row. The rows keep their
	// versions.
	convertSQL = `ALTER TABLE llmretry_breaker ALTER COLUMN state TYPE bytea USING convert_to(state::text, 'UTF8')`

	// loadSQL reads the rows of the keys in $1; a key without a row is
	// at version 0. One query serves every key being loaded at the time
	// (see batch.go).
	loadSQL = `SELECT key, version, state FROM llmretry_breaker WHERE key = ANY($1::text[])`

	// tableSQL names the table that the statements reach, as the notices
	// of its writes name it: a listener keeps the state of those alone.
	tableSQL = `SELECT 'llmretry_breaker'::regclass::oid`

	// swapSQL writes each state $3[i] as the row of key $1[i] only if
	// the row is still at version $2[i] (0: there is no row yet), as
	// version $2[i] + 1, and notifies every listening process of each
	// key it wrote in the same statement, so that no write goes
	// unannounced and no notice announces a write that failed (NOTIFY
	// is delivered at commit): on stateChannel with the table and the
	// row (see parseNotice), its state left out when the notice would be
	// too big for PostgreSQL (maxNotice, less what the rest of the
	// payload takes), and then on channel with the key. It returns
	// the keys it wrote; a key it does not return lost to another
	// write. One statement serves every
	// key being written at the time (see batch.go), each key at most
	// once. It takes its rows' locks in the order of their keys, so that
	// two processes writing the same keys at once wait for each other
	// rather than deadlock.
	//
	// It commits without waiting for the WAL to reach the disk
	// (synchronous_commit off, for this transaction only): a breaker's
	// state is worth a few milliseconds, and a crash that loses the last
	// writes loses what the next answers tell again. Other processes
	// still see the write only once it is committed. Measured here: a
	// request's store calls took 11.8 ms with the flush, 2.3 ms without.
	swapSQL = `WITH nosync AS (SELECT set_config('synchronous_commit', 'off', true)),
w AS (
	INSERT INTO llmretry_breaker AS b (key, version, state, updated_at)
	SELECT key, version + 1, state, now()
	FROM unnest($1::text[], $2::bigint[], $3::bytea[]) AS i (key, version, state)
	ORDER BY key COLLATE "C"
	ON CONFLICT (key) DO UPDATE
		SET version = EXCLUDED.version, state = EXCLUDED.state, updated_at = now()
		WHERE b.version = EXCLUDED.version - 1
	RETURNING b.key, b.version, b.state
),
n AS (
	SELECT key, 'llmretry_breaker'::regclass::oid || ':' || version || ':' AS head,
		CASE WHEN octet_length(key) + 4 * ((octet_length(state) + 2) / 3) < ` + maxNotice + `
			THEN translate(encode(state, 'base64'), E'\n', '') END AS body
	FROM w
)
SELECT n.key,
	pg_notify('` + stateChannel + `', CASE WHEN body IS NULL THEN 'n' || head || key ELSE 's' || head || body || ':' || key END),
	pg_notify('` + channel + `', n.key)
FROM n, nosync`
)

// Migrate creates the table the store keeps its rows in, if it does not
// exist yet, and converts a table made by an earlier version of this
// package, whose states were JSON, to the bytes this version keeps (see
// the package docs). It is idempotent and safe to run from
// any number of processes at once: each takes the same advisory lock
// for its one transaction, so they run one after another. Run it at
// every start of every process, or once from a deploy step. The error,
// if any, is the database's, wrapped, or says that the table has a state
// column of a type this package does not keep.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockSQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return err
		}
		var typ string
		if err := tx.QueryRow(ctx, columnSQL).Scan(&typ); err != nil {
			return fmt.Errorf("reading the type of column state: %w", err)
		}
		switch typ {
		case "bytea":
			return nil
		case "jsonb":
			_, err := tx.Exec(ctx, convertSQL)
			return err
		}
		return fmt.Errorf("column state of llmretry_breaker is %s, want bytea (or jsonb, to convert)", typ)
	})
	if err != nil {
		return fmt.Errorf("pgbreaker: migrate: %w", err)
	}
	return nil
}

// loadBatch makes the loads of calls with one query: each call gets its
// key's version and a state of its own, or the query's error.
func loadBatch(ctx context.Context, pool *pgxpool.Pool, calls []*call) {
	keys := make([]string, len(calls))
	for i, c := range calls {
		keys[i] = c.key
	}
	found := make(map[string]*call, len(calls))
	rows, err := pool.Query(ctx, loadSQL, keys)
	if err == nil {
		var r call
		_, err = pgx.ForEachRow(rows, []any{&r.key, &r.version, &r.state}, func() error {
			found[r.key] = &call{version: r.version, state: r.state}
			r.state = nil // Scan fills a slice it is given: each row gets its own
			return nil
		})
	}
	for _, c := range calls {
		if err != nil {
			c.err = err
			continue
		}
		if r := found[c.key]; r != nil {
			// A copy each: two calls may load one key, and each caller
			// may change what it got.
			c.version, c.state = r.version, append([]byte{}, r.state...)
		}
	}
}

// swapBatch makes the compare-and-swaps of calls, each of its own key,
// with one statement: each call learns whether it wrote, or gets the
// statement's error.
func swapBatch(ctx context.Context, pool *pgxpool.Pool, calls []*call) {
	keys := make([]string, len(calls))
	versions := make([]int64, len(calls))
	states := make([][]byte, len(calls))
	for i, c := range calls {
		keys[i], versions[i], states[i] = c.key, c.version, c.state
	}
	wrote := make(map[string]bool, len(calls))
	rows, err := pool.Query(ctx, swapSQL, keys, versions, states)
	if err == nil {
		var key string
		_, err = pgx.ForEachRow(rows, []any{&key, nil, nil}, func() error {
			wrote[key] = true
			return nil
		})
	}
	for _, c := range calls {
		c.ok, c.err = wrote[c.key], err
	}
}
