package pgbreaker_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
)

// Processes that start together each run Migrate on a database that has
// no table yet: none fails. Each of the 8 has a pool (a session) of its
// own, and they start at one signal; the race is on the catalog, so it
// is tried on a fresh schema 10 times.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	const procs, rounds = 8, 10
	url := pgURL(t)
	for round := range rounds {
		schemaURL := freshSchema(t, url, "pgbreaker_migrate_concurrent_"+strconv.Itoa(round))
		pools := make([]*pgxpool.Pool, procs)
		for i := range pools {
			pools[i] = newPool(t, schemaURL)
			// A connection made before the start, so that the calls
			// meet at the DDL, not at the handshake.
			if err := pools[i].Ping(t.Context()); err != nil {
				t.Fatalf("Ping() = %v", err)
			}
		}
		start := make(chan struct{})
		errs := make([]error, procs)
		var wg sync.WaitGroup
		for i, pool := range pools {
			wg.Go(func() {
				<-start
				errs[i] = pgbreaker.Migrate(t.Context(), pool)
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %d processes running Migrate at once: %v", round+1, procs, err)
		}
		for _, p := range pools {
			p.Close()
		}
	}
}

// oldSchema is the table as earlier versions of this package made it,
// with the state as jsonb.
const oldSchema = `CREATE TABLE llmretry_breaker (
	key        text        PRIMARY KEY,
	version    bigint      NOT NULL,
	state      jsonb       NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
)`

// A table made by an earlier version, whose states are JSON, is
// converted in place: each row keeps its version, and its state becomes
// the JSON text as bytes, which a Breaker reads as a state of an older
// format and starts afresh from, writing its own at the next version.
func TestMigrateConverts(t *testing.T) {
	t.Parallel()
	url := freshSchema(t, pgURL(t), "pgbreaker_migrate_converts")
	pool := newPool(t, url)
	ctx, key := t.Context(), testKey(t)
	const old = `{"v": 1, "failures": 2}`
	if _, err := pool.Exec(ctx, oldSchema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO llmretry_breaker (key, version, state) VALUES ($1, 7, $2)`, key, old); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the second finds nothing to convert
		if err := pgbreaker.Migrate(ctx, pool); err != nil {
			t.Fatalf("Migrate() #%d = %v, want nil", i+1, err)
		}
	}
	var typ string
	if err := pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'llmretry_breaker'::regclass AND attname = 'state'`).Scan(&typ); err != nil || typ != "bytea" {
		t.Fatalf("type of column state = %q, %v; want bytea", typ, err)
	}
	s := pgbreaker.New(pool)
	defer s.Close()
	st, v, err := s.Load(ctx, key)
	// jsonb keeps its text in its own normal form: the key order and
	// spacing of the document as jsonb prints it.
	if want := `{"v": 1, "failures": 2}`; err != nil || v != 7 || string(st) != want {
		t.Fatalf("Load() = %q, %d, %v; want %q, 7, nil", st, v, err, want)
	}

	// A Breaker takes the converted row as a fresh start and records
	// this call's failure in its own format, at the next version.
	b := &llmretry.Breaker{Store: s, Key: key, StoreTimeout: fleetStoreTimeout}
	c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
		Model:   model,
		Call:    func(context.Context, string) (string, error) { return "", llmretry.StatusFailure(503, nil, nil) },
		Breaker: b,
	}}}
	if _, err := c.Do(ctx, "hi"); err == nil {
		t.Fatalf("Do() = nil error, want the 503")
	}
	if st := b.State(); st.StoreErrors != 0 {
		t.Errorf("State().StoreErrors = %d (last: %v), want 0: the converted row is readable", st.StoreErrors, st.StoreErr)
	}
	st, v, err = s.Load(ctx, key)
	if err != nil || v <= 7 || !strings.Contains(string(st), `"fails":1`) {
		t.Errorf("Load() after a failed call = %q, %d, %v; want a state of the core's with one failure, past version 7", st, v, err)
	}
}

// A table whose state column has a type this package does not keep is
// left as it is, and Migrate says what is wrong.
func TestMigrateWrongType(t *testing.T) {
	t.Parallel()
	pool := newPool(t, freshSchema(t, pgURL(t), "pgbreaker_migrate_wrong"))
	if _, err := pool.Exec(t.Context(), strings.Replace(oldSchema, "jsonb", "text", 1)); err != nil {
		t.Fatal(err)
	}
	err := pgbreaker.Migrate(t.Context(), pool)
	if err == nil || !strings.HasPrefix(err.Error(), "pgbreaker: migrate: ") || !strings.Contains(err.Error(), "column state of llmretry_breaker is text") {
		t.Errorf("Migrate() = %v, want an error that names the column's type", err)
	}
}
