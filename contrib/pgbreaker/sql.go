package pgbreaker

import (
	"context"
	"errors"
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
	// table that version 0.1.0 made.
	columnSQL = `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'llmretry_breaker'::regclass AND attname = 'state' AND NOT attisdropped`

	// convertSQL turns a 0.1.0 table's JSON states into bytes: the JSON
	// text, which the core reads as a state of its first format and
	// starts afresh from, as from a new row. The rows keep their
	// versions, so a 0.1.0 process still running loses its next
	// compare-and-swap only if another process wrote in between.
	convertSQL = `ALTER TABLE llmretry_breaker ALTER COLUMN state TYPE bytea USING convert_to(state::text, 'UTF8')`

	// loadSQL reads one backend's row; no row is version 0.
	loadSQL = `SELECT version, state FROM llmretry_breaker WHERE key = $1`

	// swapSQL writes a backend's state only if its row is still at
	// version $2 (0: there is no row yet), as version $2 + 1, and
	// notifies every listening process of the key in the same statement,
	// so that no write goes unannounced and no notice announces a write
	// that failed (NOTIFY is delivered at commit). It returns one row
	// when it wrote, none when someone else wrote first.
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
	VALUES ($1, $2::bigint + 1, $3, now())
	ON CONFLICT (key) DO UPDATE
		SET version = EXCLUDED.version, state = EXCLUDED.state, updated_at = now()
		WHERE b.version = $2::bigint
	RETURNING b.key
)
SELECT pg_notify('` + channel + `', w.key) FROM w, nosync`
)

// Migrate creates the table the store keeps its rows in, if it does not
// exist yet, and converts a table made by version 0.1.0 of this package,
// whose states were JSON, to the bytes this version keeps (see the
// package docs for the schema). It is idempotent and safe to run from
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

// load reads key's row: its version and state, version 0 and a nil state
// when there is none.
func load(ctx context.Context, pool *pgxpool.Pool, key string) (version int64, state []byte, err error) {
	err = pool.QueryRow(ctx, loadSQL, key).Scan(&version, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, nil
	}
	return version, state, err
}

// swap writes state as key's row if the row is still at version old,
// and reports whether it did.
func swap(ctx context.Context, pool *pgxpool.Pool, key string, old int64, state []byte) (bool, error) {
	rows, err := pool.Query(ctx, swapSQL, key, old, state)
	if err != nil {
		return false, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n == 1, rows.Err()
}
