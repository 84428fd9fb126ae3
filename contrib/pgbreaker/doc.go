// Package pgbreaker provides a store on PostgreSQL for the state of an
// [llmretry.Breaker], so that every process of a fleet shares one
// breaker per backend: an outage is learned once, one probe goes out per
// cooldown across the fleet, and a rate-limited backend is paced by the
// requests the whole fleet let through, not each process's own.
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	...
//	if err := pgbreaker.Migrate(ctx, pool); err != nil { ... }
//	store := pgbreaker.New(pool)
//	defer store.Close()
//	b := &llmretry.Breaker{Store: store, Key: "openai/gpt-4o"}
//
// Use one [Store] per process and database, for all its Breakers; each
// backend's Breaker has its own Key. A Breaker makes each decision
// (may this call send? how did it go?) on the row: it loads it, decides
// by its own rules and writes the result back, deciding again when
// another process wrote in between (see [llmretry.BreakerStore]).
//
// # Schema
//
// [Migrate] creates one table, if it does not exist:
//
//	CREATE TABLE IF NOT EXISTS llmretry_breaker (
//		key        text        PRIMARY KEY,
//		version    bigint      NOT NULL,
//		state      bytea       NOT NULL,
//		updated_at timestamptz NOT NULL DEFAULT now()
//	)
//
// One row per backend key: the name every process gives the same
// deployment, UTF-8 without NUL and at most 2,048 bytes (see
// [Store.Load]). The version counts the row's writes; the state is the
// core's bytes, kept as the core gave them: their format is the core's
// own, and this package reads nothing of them. The table lives in the
// first schema of the connections' search_path. Rows are never deleted:
// a key no process uses any more is one small row.
//
// # Migration
//
// [Migrate] runs in one transaction, which first takes an advisory lock
// whose key is fixed (the ASCII bytes of "llmretry" read as a bigint),
// so that processes that start together run it one after another:
//
//	SELECT pg_advisory_xact_lock(7812731383617434745)
//
// It then creates the table (above), and reads the type of its state
// column:
//
//	SELECT format_type(atttypid, atttypmod) FROM pg_attribute
//	WHERE attrelid = 'llmretry_breaker'::regclass AND attname = 'state' AND NOT attisdropped
//
// Earlier versions of this package kept the state as jsonb, the core's
// state of its first format. Such a table is converted in place, each
// row keeping its version and its state becoming the JSON text, which
// the core reads as a state of an older format: it starts that backend
// afresh, as from a new row, and the fleet learns it again from the next
// answers.
//
//	ALTER TABLE llmretry_breaker ALTER COLUMN state TYPE bytea USING convert_to(state::text, 'UTF8')
//
// The conversion rewrites the table under an exclusive lock, for a
// moment with one row per backend. Upgrade every process with it: the
// two versions' states are of different formats, and neither shares
// with the other.
//
// # Statements
//
// A Store makes the calls of all its keys that are due at one time
// together: one query reads every key being loaded, one statement
// writes every key being written, and the calls that come while one
// runs make the next. A call alone costs what one statement costs, and
// a process with a thousand backends costs the database a few
// statements per round trip, on one connection of the pool for reads
// and one for writes.
//
// A read is one query:
//
//	SELECT key, version, state FROM llmretry_breaker WHERE key = ANY($1::text[])
//
// A write is one statement that writes each key only if its row is
// still at the version that was read (compare-and-swap), inserts the
// row on the first write, and announces each change to every process in
// the same statement, so that a notice never announces a write that
// lost: on one channel with the row, its state in base64, unless the
// notice would be too big for PostgreSQL (8,000 bytes, the key's
// included; a state of about 5.9 KB with a short key), and on another with the key, as earlier versions of this
// package announce it and listen for it. It takes its rows' locks in the order
// of their keys, so that two processes writing the same keys wait for
// each other rather than deadlock. It commits without waiting for the WAL flush: a breaker's
// state is soft, and a crash that loses the last writes loses what the
// next answers tell again. The notices share PostgreSQL's notification
// queue (8 GB by default) with every other NOTIFY of the server; one that
// carries a state takes up to 8 KB of it until every listener has read
// it, and a write fails if the queue is full:
// pg_notification_queue_usage() tells how full it is.
//
//	WITH nosync AS (SELECT set_config('synchronous_commit', 'off', true)),
//	w AS (
//		INSERT INTO llmretry_breaker AS b (key, version, state, updated_at)
//		SELECT key, version + 1, state, now()
//		FROM unnest($1::text[], $2::bigint[], $3::bytea[]) AS i (key, version, state)
//		ORDER BY key COLLATE "C"
//		ON CONFLICT (key) DO UPDATE
//			SET version = EXCLUDED.version, state = EXCLUDED.state, updated_at = now()
//			WHERE b.version = EXCLUDED.version - 1
//		RETURNING b.key, b.version, b.state
//	),
//	n AS (
//		SELECT key, 'llmretry_breaker'::regclass::oid || ':' || version || ':' AS head,
//			CASE WHEN octet_length(key) + 4 * ((octet_length(state) + 2) / 3) < 7900
//				THEN translate(encode(state, 'base64'), E'\n', '') END AS body
//		FROM w
//	)
//	SELECT n.key,
//		pg_notify('llmretry_breaker_state', CASE WHEN body IS NULL THEN 'n' || head || key ELSE 's' || head || body || ':' || key END),
//		pg_notify('llmretry_breaker', n.key)
//	FROM n, nosync
//
// A key the write does not return lost to another process's write: the
// core reads the state again and decides again. A statement writes a
// key at most once; a second call on the same key waits for the next.
//
// # Waking
//
// Each [Store] holds one connection of its own, outside the pool, that
// runs LISTEN llmretry_breaker; LISTEN llmretry_breaker_state and hands
// each notice to the calls of this process waiting on that key, so that
// a call waiting on an open or paced backend wakes when another process
// changes its state, without polling. It keeps the state the newest
// notice of each key this process uses carried ([Store.Noticed]), and a
// Breaker decides on it without loading the row: a process reads a row
// only when no notice carried its state (a row too big, a write by an
// earlier version of this package, a connection lost meanwhile) or a
// write of its own lost to one whose notice has not come yet. Notices
// name the table written, as the connection reads its own once it
// listens:
//
//	SELECT 'llmretry_breaker'::regclass::oid
//
// When that connection is lost, the store connects again (after
// 50 ms, doubling up to 2 s), and once it listens again it wakes every
// waiting call, since a change may have gone unheard meanwhile. A
// connection silent for 30 s is pinged, and one whose ping takes more
// than 5 s counts as lost: a partition drops a connection without a
// word. What the notices said is forgotten as the connection is lost.
// One connection listens for every key: the payload names the key that
// changed. The channels are the database's, not a schema's:
// fleets in two schemas of one database that use the same key wake each
// other's calls, which then load their own rows and find nothing
// changed.
//
// # Errors and timing
//
// Every call returns by the end of the context the core gives it, which
// bounds it (see [llmretry.Breaker]), with the context's error if its
// statement has not answered by then. The statement itself goes on for
// the other calls of its batch: cutting one short makes pgx close its
// connection, which costs the pool a new one, and the server may well
// finish the statement anyway. It is cancelled once every call of its
// batch has returned, so that a server that hangs holds one connection
// of each kind, not more. A write whose call returned early may still
// land, as the core allows (see [llmretry.BreakerStore]). A write whose
// context is done before its statement is sent is left out of it. An
// error goes back to the core, which decides from the process's own
// state for that call and counts the failure; nothing here retries.
//
// # Cost
//
// Measured on this machine (2 cores shared with other work, load
// average 3 to 7, PostgreSQL 15 on loopback), by BenchmarkRequest,
// TestManyKeys, TestFleet and TestFleetCallers in this package:
//
//   - A request through a Breaker on a Store, one at a time: 2 writes
//     (one decision to send, one to record how it went) and 0.07 loads,
//     0.96 ms of store time in all: the notices carry the state, so a
//     process loads only when one has not come yet. Before the notices
//     carried it, 2 loads and 1.1 to 1.6 ms; before the writes turned
//     synchronous_commit off (see Statements), 11.8 ms.
//   - From two goroutines of one process at once: 0.04 loads and 2
//     writes per request, 0.89 ms: the process decides for its calls
//     together.
//   - A thousand Breakers, each its own key, three calls each, all at
//     once through a pool of four connections: about 3,000 store calls,
//     0.2 to 0.3 s in all, none failed.
//   - Four processes whose calls queue for a rate-limited backend, 10 or
//     100 callers each, at the default StoreTimeout: 0.01 to 0.03 loads
//     and 1.7 to 1.8 writes per request sent, no more at 100 callers
//     than at 10 (2.6 to 3 loads before the notices carried the state).
//   - In TestFleet's four processes, whose calls wait on a paced and on
//     an open backend: 0.1 loads and 2.5 writes per request sent (3.1
//     loads before).
//
// The Breaker's StoreTimeout (100 ms by default) bounds the store calls
// of one decision. A decision on a healthy database takes a few
// milliseconds; on this loaded machine, a thousand decisions of one
// process at once used up to 94 ms of it before the store was called,
// and about one run in ten then failed a few hundred store calls: give
// a process with that many backends a longer StoreTimeout (at 250 ms,
// none failed).
//
// # Concurrency
//
// A [Store] is safe for concurrent use by any number of Breakers and
// calls; use one per process and pool.
package pgbreaker
