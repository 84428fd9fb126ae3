package pgbreaker_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
	"github.com/llmretry/llmretry/llmretrytest"
)

// newStore migrates the schema behind url and returns a store on a pool
// of its own (a process of its own), closed at the end of the test.
func newStore(t *testing.T, url string) (*pgbreaker.Store, *pgxpool.Pool) {
	t.Helper()
	pool := newPool(t, url)
	if err := pgbreaker.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("Migrate() = %v", err)
	}
	s := pgbreaker.New(pool)
	t.Cleanup(s.Close)
	return s, pool
}

// testKey is a key no other test uses: notices go to every listener of
// the database, whatever its schema, so tests keep apart by key.
func testKey(t *testing.T) string { return "test/" + t.Name() }

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	url := freshSchema(t, pgURL(t), "pgbreaker_migrate")
	pool := newPool(t, url)
	for i := range 2 {
		if err := pgbreaker.Migrate(t.Context(), pool); err != nil {
			t.Fatalf("Migrate() #%d = %v, want nil", i+1, err)
		}
	}
}

// The store keeps the contract every Breaker relies on, checked by the
// core's own conformance suite on a real database.
func TestConformance(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, freshSchema(t, pgURL(t), "pgbreaker_conformance"))
	llmretrytest.TestBreakerStore(t, testKey(t), func() llmretry.BreakerStore { return s })
}

// Writers in two processes (two pools), each loading, adding one and
// swapping until it wins, lose no increment: the swap is atomic. The
// writers of one process that write at once at the same version meet in
// one batch, which may write a key only once.
func TestCompareAndSwapRace(t *testing.T) {
	t.Parallel()
	url := freshSchema(t, pgURL(t), "pgbreaker_race")
	a, _ := newStore(t, url)
	b, _ := newStore(t, url)
	ctx, key := t.Context(), testKey(t)
	const writers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for range each {
				for {
					st, v, err := s.Load(ctx, key)
					if err != nil {
						errs <- err
						return
					}
					n, _ := strconv.Atoi(string(st)) // the state is a count, in decimal; no row is 0
					ok, err := s.CompareAndSwap(ctx, key, v, []byte(strconv.Itoa(n+1)))
					if err != nil {
						errs <- err
						return
					}
					if ok {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Load or CompareAndSwap = %v", err)
	}
	st, v, err := a.Load(ctx, key)
	if want := strconv.Itoa(writers * each); err != nil || string(st) != want || v != writers*each {
		t.Errorf("Load() = %q, version %d, %v; want %q, %d, nil", st, v, err, want, writers*each)
	}
}

// Two processes writing the same keys at once, many keys to a
// statement, lose no increment and never deadlock: each statement takes
// its rows' locks in the order of their keys. Each key is counted up by
// writers in both processes, whose writes of all keys meet in the same
// statements in whatever order they come.
func TestCompareAndSwapManyKeys(t *testing.T) {
	t.Parallel()
	url := freshSchema(t, pgURL(t), "pgbreaker_race_keys")
	stores := []*pgbreaker.Store{}
	for range 2 {
		s, _ := newStore(t, url)
		stores = append(stores, s)
	}
	const keys, writers, each = 64, 2, 5 // writers per key and process
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, keys*writers*len(stores))
	for k := range keys {
		key := testKey(t) + "/" + strconv.Itoa(k)
		for _, s := range stores {
			for range writers {
				wg.Go(func() {
					for range each {
						if err := increment(ctx, s, key); err != nil {
							errs <- err
							return
						}
					}
				})
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Load or CompareAndSwap = %v", err)
	}
	for k := range keys {
		key := testKey(t) + "/" + strconv.Itoa(k)
		want := writers * each * len(stores)
		if st, v, err := stores[0].Load(ctx, key); err != nil || string(st) != strconv.Itoa(want) || v != int64(want) {
			t.Errorf("Load(%s) = %q, version %d, %v; want %q, %d, nil", key, st, v, err, strconv.Itoa(want), want)
		}
	}
}

// increment adds one to the count in decimal that is key's state,
// loading and writing until its write wins.
func increment(ctx context.Context, s *pgbreaker.Store, key string) error {
	for {
		st, v, err := s.Load(ctx, key)
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(string(st)) // no row is 0
		ok, err := s.CompareAndSwap(ctx, key, v, []byte(strconv.Itoa(n+1)))
		if ok || err != nil {
			return err
		}
	}
}

// hexKey is a key of n bytes of hex of counted hashes: a key that no
// compression brings under the index's limit.
func hexKey(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%x", sha256.Sum256([]byte(strconv.Itoa(i))))
	}
	return b.String()[:n]
}

// A key that PostgreSQL's text or the table's index cannot hold is
// refused with an error of its own, and the calls of other keys made at
// the same time, which may share its statement, still work; the longest
// key allowed is one the table takes.
func TestBadKey(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, freshSchema(t, pgURL(t), "pgbreaker_bad_key"))
	ctx := t.Context()
	tests := []struct{ name, key, want string }{
		{"nul", "nul\x00key", "not text PostgreSQL can hold"},
		{"latin1", "latin1 \xe9t\xe9", "not text PostgreSQL can hold"},
		{"too_long", hexKey(2800), "key is 2800 bytes, more than the 2048 bytes a key may be"}, // the index takes no more than 2,704
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			var good error
			wg.Go(func() { _, good = s.CompareAndSwap(ctx, testKey(t)+"/good", 0, []byte("x")) })
			_, _, lerr := s.Load(ctx, tc.key)
			_, serr := s.CompareAndSwap(ctx, tc.key, 0, []byte("x"))
			wg.Wait()
			for _, err := range []error{lerr, serr} {
				if err == nil || !strings.HasPrefix(err.Error(), "pgbreaker: ") || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Load or CompareAndSwap(%.40q) = %v, want an error containing %q", tc.key, err, tc.want)
				}
			}
			if good != nil {
				t.Errorf("CompareAndSwap(good key) = %v, want nil", good)
			}
			if _, err := s.CompareAndSwap(ctx, testKey(t)+"/good", 0, nil); err != nil {
				t.Errorf("CompareAndSwap(good key, again) = %v, want nil", err)
			}
		})
	}
	t.Run("longest", func(t *testing.T) {
		key := hexKey(pgbreaker.MaxKey)
		if ok, err := s.CompareAndSwap(ctx, key, 0, []byte("x")); !ok || err != nil {
			t.Fatalf("CompareAndSwap(a key of %d bytes) = %v, %v, want true, nil", len(key), ok, err)
		}
		if state, ver, err := s.Load(ctx, key); string(state) != "x" || ver != 1 || err != nil {
			t.Errorf("Load(a key of %d bytes) = %q, %d, %v, want %q, 1, nil", len(key), state, ver, err, "x")
		}
	})
}

// CheckKey refuses a key longer than MaxKey bytes, counted in bytes,
// not runes, and one that is not text, before any statement; an error
// names a long key by its first bytes only.
func TestCheckKey(t *testing.T) {
	a := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name, key string
		ok        bool
	}{
		{"longest", a(pgbreaker.MaxKey), true},
		{"one_byte_over", a(pgbreaker.MaxKey + 1), false},
		{"rune_ending_at_the_bound", a(pgbreaker.MaxKey-2) + "é", true},
		{"rune_across_the_bound", a(pgbreaker.MaxKey-1) + "é", false},
		{"nul", "a\x00b", false},
		{"not_utf8", "\xff", false},
		{"empty", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := pgbreaker.CheckKey(tc.key); (err == nil) != tc.ok {
				t.Errorf("CheckKey(a key of %d bytes) = %v, want ok %v", len(tc.key), err, tc.ok)
			}
		})
	}
	long := a(100) + "ééé"
	if got, want := pgbreaker.QuoteKey(long), `"`+a(64)+`"…`; got != want {
		t.Errorf("QuoteKey(a key of %d bytes) = %s, want %s", len(long), got, want)
	}
	cut := a(63) + "é" // the rune crosses the 64th byte: cut before it
	if got, want := pgbreaker.QuoteKey(cut+"more"), `"`+a(63)+`"…`; got != want {
		t.Errorf("QuoteKey(%q) = %s, want %s", cut+"more", got, want)
	}
	if got, want := pgbreaker.QuoteKey("openai/gpt-4o"), `"openai/gpt-4o"`; got != want {
		t.Errorf("QuoteKey(short) = %s, want %s", got, want)
	}
}

// recv waits for a value on ch, and fails the test if ch is closed or
// none comes before the test's deadline.
func recv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the watch channel was closed", what)
		}
	case <-t.Context().Done():
		t.Fatalf("%s: no wake before the test ended", what)
	}
}

// A write in one process wakes a watcher in another, also after the
// watcher's listening connection was cut and came back.
func TestWatch(t *testing.T) {
	t.Parallel()
	// Its connections by name: the listeners of tests running at once
	// are not this test's to cut.
	url := freshSchema(t, pgURL(t), "pgbreaker_watch") + "&application_name=pgbreaker_test_watch"
	watcher, pool := newStore(t, url)
	writer, _ := newStore(t, url)
	ctx, key := t.Context(), testKey(t)

	ch, err := watcher.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch() = %v", err)
	}
	// Only once the store listens can a write be sure to be heard. It
	// then wakes every watcher, as a change may have come before: that
	// wake is not the one this test waits for.
	if err := pgbreaker.Listening(ctx, watcher); err != nil {
		t.Fatalf("Listening() = %v", err)
	}
	select {
	case <-ch:
	default:
	}
	if ok, err := writer.CompareAndSwap(ctx, key, 0, []byte("1")); !ok || err != nil {
		t.Fatalf("CompareAndSwap() = %v, %v; want true, nil", ok, err)
	}
	// A write wakes twice, its notice on the key's channel first: the
	// state comes with the second.
	recv(t, ch, "a write in another process")
	for _, ver, ok := watcher.Noticed(key); !ok || ver != 1; _, ver, ok = watcher.Noticed(key) {
		recv(t, ch, "the write's state")
	}

	// Cut the listening connection from the server's side, as a restart
	// or a failover would: the store connects again and wakes its
	// watchers, since a change may have gone unheard meanwhile.
	var cut int
	if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = 'pgbreaker_test_watch' AND query LIKE 'LISTEN llmretry_breaker%' AND pid <> pg_backend_pid()`).Scan(&cut); err != nil || cut == 0 {
		t.Fatalf("terminating the listeners = %d, %v; want at least 1", cut, err)
	}
	// A write wakes twice (its notices on both channels): wait for a
	// wake after which the notices kept are forgotten.
	for _, _, ok := watcher.Noticed(key); ok; _, _, ok = watcher.Noticed(key) {
		recv(t, ch, "reconnect")
	}
	if ok, err := writer.CompareAndSwap(ctx, key, 1, []byte("2")); !ok || err != nil {
		t.Fatalf("CompareAndSwap() = %v, %v; want true, nil", ok, err)
	}
	recv(t, ch, "a write after the reconnect")
}

// A watch ends, its channel closed, when its context is done or the
// store is closed; after Close, Watch fails.
func TestWatchEnds(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgURL(t))
	s := pgbreaker.New(pool)
	ctx, cancel := context.WithCancel(t.Context())
	byCtx, err := s.Watch(ctx, testKey(t))
	if err != nil {
		t.Fatalf("Watch() = %v", err)
	}
	byClose, err := s.Watch(t.Context(), testKey(t))
	if err != nil {
		t.Fatalf("Watch() = %v", err)
	}
	cancel()
	drain(t, byCtx, "cancelled watch")
	s.Close()
	drain(t, byClose, "watch of a closed store")
	if ch, err := s.Watch(t.Context(), testKey(t)); ch != nil || err == nil {
		t.Errorf("Watch() after Close = %v, %v; want nil, an error", ch, err)
	}
}

// drain reads ch until it is closed.
func drain(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-t.Context().Done():
			t.Fatalf("%s: channel not closed before the test ended", what)
		}
	}
}

// Each call ends with an error once its context is done, against a
// database that accepts connections and never answers, and one that
// refuses them.
func TestCallsBounded(t *testing.T) {
	t.Parallel()
	hole := llmretrytest.NewBlackhole()
	t.Cleanup(hole.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	ln.Close()
	tests := []struct {
		name    string
		addr    string
		timeout bool // the call ends by its context's deadline
	}{
		{"never_answers", strings.TrimPrefix(hole.URL, "http://"), true},
		{"refuses", closedAddr, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := newPool(t, "postgres://u:p@"+tc.addr+"/db?sslmode=disable&connect_timeout=30")
			s := pgbreaker.New(pool)
			defer s.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			_, _, err := s.Load(ctx, testKey(t))
			if err == nil || !strings.HasPrefix(err.Error(), "pgbreaker: ") || errors.Is(err, context.DeadlineExceeded) != tc.timeout {
				t.Errorf("Load() = %v, want a pgbreaker error, a timeout: %v", err, tc.timeout)
			}
			if _, err := s.CompareAndSwap(ctx, testKey(t), 0, []byte("x")); err == nil {
				t.Errorf("CompareAndSwap() = nil error, want one")
			}
		})
	}
}
