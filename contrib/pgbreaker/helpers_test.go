package pgbreaker_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgURLVar names the environment variable with the test database's URL,
// as .ci/postgres.sh prints it (the River adapter's tests read the same).
const pgURLVar = "LLMRETRY_PG_URL"

// pgURL returns the test database's URL. Without one the test is skipped,
// except in CI (CI=true), where a missing server is a failure: the
// integration tests must never pass by not running.
func pgURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(pgURLVar)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set, and CI=true: start PostgreSQL with .ci/postgres.sh and export its URL", pgURLVar)
		}
		t.Skipf("%s is not set; to run against a real PostgreSQL: export %s=\"$(.ci/postgres.sh)\"", pgURLVar, pgURLVar)
	}
	return url
}

// freshSchema creates an empty schema of the test's own and returns a URL
// whose connections use it (search_path), so that tests running at once,
// here and in other modules on the same database, never share a row. The
// schema is dropped at the end unless the test failed.
func freshSchema(t testing.TB, url, schema string) string {
	t.Helper()
	ctx := context.Background()
	pool := newPool(t, url)
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE; CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("creating schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("schema %s kept for inspection", schema)
			return
		}
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return withSearchPath(url, schema)
}

// withSearchPath adds search_path=schema to a postgres:// URL, which pgx
// sends as a run-time parameter of every connection.
func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// newPool opens a pool of its own, closed at the end of the test: each
// pool stands for one process's connections.
func newPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("pgxpool.New() = %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
