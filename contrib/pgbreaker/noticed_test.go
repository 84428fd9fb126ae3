package pgbreaker_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/llmretry/llmretry/contrib/pgbreaker"
)

// Another process's write reaches this one's Noticed with its notice:
// the state and its version, for a key with a colon and non-ASCII text
// in it. A state too big for a NOTIFY comes without it, and so does a
// write announced the way an earlier version of this package announces
// it (the key alone): Noticed then says none, until a notice carries a
// state again.
func TestNoticed(t *testing.T) {
	t.Parallel()
	url := freshSchema(t, pgURL(t), "pgbreaker_noticed")
	reader, _ := newStore(t, url)
	writer, pool := newStore(t, url)
	ctx, key := t.Context(), testKey(t)+"/a:b/ü"

	ch, err := reader.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch() = %v", err)
	}
	if err := pgbreaker.Listening(ctx, reader); err != nil {
		t.Fatalf("Listening() = %v", err)
	}
	select {
	case <-ch: // the wake of the listen itself
	default:
	}
	if _, _, ok := reader.Noticed(key); ok {
		t.Fatal("Noticed() before any write = ok, want none")
	}

	small, big := []byte(`{"v":2,"fails":1}`), bytes.Repeat([]byte("z"), 6<<10)
	steps := []struct {
		what   string
		write  func() error
		want   []byte // nil: none
		wantOK bool
	}{
		{"a small state", func() error { return swap(t, writer, key, 0, small) }, small, true},
		{"a state too big for a notice", func() error { return swap(t, writer, key, 1, big) }, nil, false},
		{"a small state again", func() error { return swap(t, writer, key, 2, small) }, small, true},
		{"an older version's notice", func() error {
			_, err := pool.Exec(ctx, "SELECT pg_notify('llmretry_breaker', $1)", key)
			return err
		}, nil, false},
	}
	for i, s := range steps {
		if err := s.write(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		// A write sends two notices, the key's and the state's: wait
		// until the state's has come, or, when none carries it, for the
		// first.
		deadline := time.After(10 * time.Second)
		for done := false; !done; {
			select {
			case <-ch:
			case <-deadline:
				got, ver, ok := reader.Noticed(key)
				t.Fatalf("10 s after %s: Noticed() = %d bytes, version %d, %v; want %d bytes, %v", s.what, len(got), ver, ok, len(s.want), s.wantOK)
			}
			got, ver, ok := reader.Noticed(key)
			done = ok == s.wantOK && (!ok || ver == int64(min(i+1, 3)) && bytes.Equal(got, s.want))
		}
	}
}

// swap writes state at version for key with s, and fails unless it
// wrote.
func swap(t *testing.T, s *pgbreaker.Store, key string, version int64, state []byte) error {
	t.Helper()
	ok, err := s.CompareAndSwap(t.Context(), key, version, state)
	if err == nil && !ok {
		t.Fatalf("CompareAndSwap(version %d) lost, want a write", version)
	}
	return err
}

// The notices are the database's, not a schema's: a process whose rows
// are in another schema's table, under the same key, takes no state
// from a write there. Here the other schema's write commits first, and
// this schema's next: what this process keeps is its own table's row.
func TestNoticedKeepsToItsTable(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	url := freshSchema(t, pgURL(t), "pgbreaker_noticed_mine")
	reader, _ := newStore(t, url)
	writer, _ := newStore(t, url)
	other, _ := newStore(t, freshSchema(t, pgURL(t), "pgbreaker_noticed_other"))
	ctx := t.Context()
	ch, err := reader.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch() = %v", err)
	}
	if err := pgbreaker.Listening(ctx, reader); err != nil {
		t.Fatalf("Listening() = %v", err)
	}
	for _, w := range []struct {
		s     *pgbreaker.Store
		state string
	}{{other, "theirs"}, {writer, "mine"}} {
		if err := swap(t, w.s, key, 0, []byte(w.state)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("no state noticed 10 s after the writes")
		}
		if got, _, ok := reader.Noticed(key); ok {
			if string(got) != "mine" {
				t.Errorf("Noticed() = %q, want %q: the state of this process's own table", got, "mine")
			}
			return
		}
	}
}
