package llmretrytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/llmretry/llmretry"
)

// TestBreakerStore checks that a [llmretry.BreakerStore] keeps the
// contract a Breaker relies on, as testing/fstest.TestFS checks a file
// system: a key never written loads as nil at version 0; a
// compare-and-swap writes only at the stored version and makes it
// version+1; what is stored comes back byte for byte, whatever the bytes,
// and the store keeps no slice of its caller's; keys are apart;
// concurrent compare-and-swaps at one version let exactly one through; a
// Watch hears a change of its key and is closed when its context ends
// (unless the store cannot watch: a nil channel); a store whose notices
// carry the state ([llmretry.StateNotifier]) has, once a Watch heard of
// a change, that state and version, or none, in Noticed, never another;
// a call whose context is done returns an error and writes nothing. Each
// check runs as a subtest on a store newStore returns, with keys that
// begin with prefix, so a store on a shared database can be checked as
// it is. Call it from a test of the store's own package, as pgbreaker's
// tests do:
//
//	func TestConformance(t *testing.T) {
//		llmretrytest.TestBreakerStore(t, "conformance", func() llmretry.BreakerStore { return store })
//	}
func TestBreakerStore(t *testing.T, prefix string, newStore func() llmretry.BreakerStore) {
	t.Helper()
	for _, c := range storeChecks {
		t.Run(c.name, func(t *testing.T) {
			err := c.check(newStore(), prefix+"/"+c.name)
			if errors.Is(err, errCannotWatch) {
				t.Skip("the store cannot watch: Breakers poll it")
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
}

// errCannotWatch is the watch check's answer for a store that cannot.
var errCannotWatch = errors.New("cannot watch")

// storeChecks are TestBreakerStore's checks, each of a store and a key
// of its own.
var storeChecks = []struct {
	name  string
	check func(s llmretry.BreakerStore, key string) error
}{
	{"new_key", checkNewKey},
	{"compare_and_swap", checkCompareAndSwap},
	{"keys_apart", checkKeysApart},
	{"one_winner", checkOneWinner},
	{"watch", checkWatch},
	{"noticed", checkNoticed},
	{"done_context", checkDoneContext},
	{"not_kept", checkNotKept},
}

func checkNewKey(s llmretry.BreakerStore, k string) error {
	st, ver, err := s.Load(context.Background(), k)
	if err != nil || ver != 0 || st != nil {
		return fmt.Errorf("Load(new key) = %q, %d, %v, want nil, 0, nil", st, ver, err)
	}
	return nil
}

func checkCompareAndSwap(s llmretry.BreakerStore, k string) error {
	ctx := context.Background()
	for v, data := range [][]byte{[]byte(`{"v":2,"a":1}`), {0, 1, 2, 255}, bytes.Repeat([]byte("x"), 64<<10)} {
		if ok, err := s.CompareAndSwap(ctx, k, int64(v), data); !ok || err != nil {
			return fmt.Errorf("CompareAndSwap(version %d) = %v, %v, want true, nil", v, ok, err)
		}
		got, ver, err := s.Load(ctx, k)
		if err != nil || ver != int64(v+1) || !bytes.Equal(got, data) {
			return fmt.Errorf("Load() after a write at version %d = %d bytes, version %d, %v; want the %d bytes written, version %d", v, len(got), ver, err, len(data), v+1)
		}
	}
	if ok, err := s.CompareAndSwap(ctx, k, 1, []byte("stale")); ok || err != nil {
		return fmt.Errorf("CompareAndSwap(old version) = %v, %v, want false, nil", ok, err)
	}
	if got, ver, _ := s.Load(ctx, k); ver != 3 || bytes.Equal(got, []byte("stale")) {
		return fmt.Errorf("Load() after a failed write = %q, %d, want the state of version 3", got, ver)
	}
	return nil
}

func checkKeysApart(s llmretry.BreakerStore, k string) error {
	ctx := context.Background()
	if ok, err := s.CompareAndSwap(ctx, k+"/a", 0, []byte("a")); !ok || err != nil {
		return fmt.Errorf("CompareAndSwap(a) = %v, %v, want true, nil", ok, err)
	}
	if st, ver, err := s.Load(ctx, k+"/b"); st != nil || ver != 0 || err != nil {
		return fmt.Errorf("Load(b) = %q, %d, %v, want nil, 0, nil: only a was written", st, ver, err)
	}
	return nil
}

func checkOneWinner(s llmretry.BreakerStore, k string) error {
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins []string
		errs []error
	)
	for i := range 8 {
		wg.Go(func() {
			me := strconv.Itoa(i)
			ok, err := s.CompareAndSwap(ctx, k, 0, []byte(me))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if ok {
				wins = append(wins, me)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("concurrent CompareAndSwap() = %w", err)
	}
	if len(wins) != 1 {
		return fmt.Errorf("8 concurrent writes at version 0: %d won (%v), want exactly 1", len(wins), wins)
	}
	if got, ver, err := s.Load(ctx, k); err != nil || ver != 1 || string(got) != wins[0] {
		return fmt.Errorf("Load() = %q, %d, %v, want the winner's %q at version 1", got, ver, err, wins[0])
	}
	return nil
}

func checkWatch(s llmretry.BreakerStore, k string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := s.Watch(ctx, k)
	if err != nil {
		return fmt.Errorf("Watch() = %v", err)
	}
	if ch == nil {
		return errCannotWatch
	}
	if ok, err := s.CompareAndSwap(context.Background(), k, 0, []byte("x")); !ok || err != nil {
		return fmt.Errorf("CompareAndSwap() = %v, %v, want true, nil", ok, err)
	}
	select {
	case _, ok := <-ch:
		if !ok {
			return errors.New("the watch's channel closed, want a change")
		}
	case <-time.After(10 * time.Second):
		return errors.New("the watch heard no change in 10 s")
	}
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return nil
			}
		case <-deadline:
			return errors.New("the watch's channel is still open 10 s after its context ended")
		}
	}
}

func checkNoticed(s llmretry.BreakerStore, k string) error {
	n, ok := s.(llmretry.StateNotifier)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := s.Watch(ctx, k)
	if err != nil || ch == nil {
		return fmt.Errorf("Watch() = %v, %v: a StateNotifier's notices come through its watches", ch, err)
	}
	small, big := []byte(`{"v":2,"n":1}`), bytes.Repeat([]byte("y"), 64<<10)
	for v, data := range [][]byte{small, big} {
		if ok, err := s.CompareAndSwap(context.Background(), k, int64(v), data); !ok || err != nil {
			return fmt.Errorf("CompareAndSwap(version %d) = %v, %v, want true, nil", v, ok, err)
		}
		// Notices may come for earlier changes first: wait for this one's.
		deadline := time.After(10 * time.Second)
		for {
			select {
			case <-ch:
			case <-deadline:
				return fmt.Errorf("Noticed() did not tell of version %d within 10 s of its write", v+1)
			}
			got, ver, ok := n.Noticed(k)
			if ok && (ver > int64(v+1) || ver == int64(v+1) && !bytes.Equal(got, data)) {
				return fmt.Errorf("Noticed() = %d bytes at version %d, want the %d bytes of version %d", len(got), ver, len(data), v+1)
			}
			// A state too big for a notice may come without it.
			if ok && ver == int64(v+1) || !ok && len(data) > len(small) {
				break
			}
		}
	}
	return nil
}

func checkDoneContext(s llmretry.BreakerStore, k string) error {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Load(done, k); err == nil {
		return errors.New("Load(done context) = nil error, want one")
	}
	if ok, err := s.CompareAndSwap(done, k, 0, []byte("x")); ok || err == nil {
		return fmt.Errorf("CompareAndSwap(done context) = %v, %v, want false and an error", ok, err)
	}
	if st, ver, err := s.Load(context.Background(), k); st != nil || ver != 0 || err != nil {
		return fmt.Errorf("Load() after a cancelled write = %q, %d, %v, want nothing written", st, ver, err)
	}
	return nil
}

func checkNotKept(s llmretry.BreakerStore, k string) error {
	ctx := context.Background()
	data := []byte("before")
	if ok, err := s.CompareAndSwap(ctx, k, 0, data); !ok || err != nil {
		return fmt.Errorf("CompareAndSwap() = %v, %v, want true, nil", ok, err)
	}
	copy(data, "AFTER!") // the Breaker reuses its buffers
	got, _, _ := s.Load(ctx, k)
	if string(got) != "before" {
		return fmt.Errorf("Load() = %q after the caller changed the bytes it wrote, want %q: a store must not keep them", got, "before")
	}
	copy(got, "xxxxxx")
	if again, _, _ := s.Load(ctx, k); string(again) != "before" {
		return fmt.Errorf("Load() = %q after the caller changed the bytes it loaded, want %q", again, "before")
	}
	return nil
}
