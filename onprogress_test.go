package llmretry_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// hookLog records the calls of progress hooks, by name, in order.
type hookLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *hookLog) hook(name string) func() {
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls = append(l.calls, name)
	}
}

func (l *hookLog) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

// Every Delivered and Progress call of an attempt reaches the hook once,
// from any goroutine, and stacked hooks are called outermost first.
func TestOnProgress(t *testing.T) {
	var (
		log     hookLog
		outside []string
	)
	stream := newFake("a", func(ctx context.Context, _ int) error {
		llmretry.Progress(ctx)
		done := make(chan struct{})
		go func() { // a stream's reader may run on a goroutine of its own
			defer close(done)
			llmretry.Delivered(ctx)
		}()
		<-done
		llmretry.Delivered(ctx)
		outside = log.seen()
		return nil
	})
	c := &chain{Backends: []backend{{Model: "a", Call: stream.Call}}}
	ctx := llmretry.OnProgress(context.Background(), log.hook("outer"))
	ctx = llmretry.OnProgress(ctx, log.hook("inner"))
	if got, err := c.Do(ctx, "hi"); got != "a: hi" || err != nil {
		t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
	}
	want := []string{"outer", "inner", "outer", "inner", "outer", "inner"}
	if diff := cmp.Diff(want, log.seen()); diff != "" {
		t.Errorf("hook calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, outside); diff != "" {
		t.Errorf("hook calls before the Call returned (-want +got):\n%s", diff)
	}
}

// Outside an attempt Delivered and Progress do nothing, the hook
// included; a nil hook or context changes nothing.
func TestOnProgressOutsideAnAttempt(t *testing.T) {
	var log hookLog
	ctx := llmretry.OnProgress(context.Background(), log.hook("hook"))
	llmretry.Delivered(ctx)
	llmretry.Progress(ctx)
	if got := log.seen(); len(got) != 0 {
		t.Errorf("hook calls outside an attempt = %v, want none", got)
	}
	bg := context.Background()
	if got := llmretry.OnProgress(bg, nil); got != bg {
		t.Errorf("OnProgress(ctx, nil) = %v, want ctx itself", got)
	}
	//lint:ignore SA1012 a nil context is what this checks
	if got := llmretry.OnProgress(nil, log.hook("hook")); got != nil {
		t.Errorf("OnProgress(nil, f) = %v, want nil", got)
	}
}

// The hook hears a nested chain's attempts, and those of a Standalone
// chain run inside an attempt: both run under the hook's context.
func TestOnProgressNested(t *testing.T) {
	for _, standalone := range []bool{false, true} {
		var log hookLog
		inner := &chain{Backends: []backend{{Model: "inner", Call: newFake("inner", func(ctx context.Context, _ int) error {
			llmretry.Delivered(ctx)
			return nil
		}).Call}}}
		outer := &chain{Backends: []backend{{Model: "outer", Call: func(ctx context.Context, req string) (string, error) {
			if standalone {
				ctx = llmretry.Standalone(ctx)
			}
			return inner.Do(ctx, req)
		}}}}
		ctx := llmretry.OnProgress(context.Background(), log.hook("hook"))
		if _, err := outer.Do(ctx, "hi"); err != nil {
			t.Fatalf("standalone %v: Do() = %v, want nil", standalone, err)
		}
		if got := log.seen(); len(got) != 1 {
			t.Errorf("standalone %v: hook calls = %v, want one", standalone, got)
		}
	}
}
