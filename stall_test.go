package llmretry_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
)

// stream hands over chunks, one every interval, calling Delivered for each,
// then answers; with stall set it hangs after the last chunk instead. It
// returns the context's cause when the context ends first.
func stream(chunks int, every time.Duration, stall bool) func(context.Context, int) error {
	return streamMarking(llmretry.Delivered, chunks, every, stall)
}

// buffered is stream for a backend that holds its chunks and answers
// whole: it reports Progress for each chunk instead of Delivered.
func buffered(chunks int, every time.Duration, stall bool) func(context.Context, int) error {
	return streamMarking(llmretry.Progress, chunks, every, stall)
}

// streamMarking is stream, calling mark for each chunk.
func streamMarking(mark func(context.Context), chunks int, every time.Duration, stall bool) func(context.Context, int) error {
	return func(ctx context.Context, _ int) error {
		for range chunks {
			t := time.NewTimer(every)
			select {
			case <-ctx.Done():
				t.Stop()
				return context.Cause(ctx)
			case <-t.C:
			}
			mark(ctx)
		}
		if stall {
			<-ctx.Done()
			return context.Cause(ctx)
		}
		return nil
	}
}

// firstThen runs first on the first call and streams three chunks on
// later ones.
func firstThen(first func(context.Context, int) error) func(context.Context, int) error {
	return func(ctx context.Context, n int) error {
		if n == 1 {
			return first(ctx, n)
		}
		return stream(3, 100*ms, false)(ctx, n)
	}
}

// hangFirst hangs on the first call until its context ends, returning
// the cause, and streams three chunks on later ones.
var hangFirst = firstThen(func(ctx context.Context, _ int) error {
	<-ctx.Done()
	return context.Cause(ctx)
})

var errBlame = llmretry.StatusFailure(400, nil, errors.New("bad request"))

// ctxs keeps the contexts a backend's calls received, to check after Do.
type ctxs struct {
	mu   sync.Mutex
	list []context.Context
}

func (c *ctxs) wrap(reply func(context.Context, int) error) func(context.Context, int) error {
	return func(ctx context.Context, n int) error {
		c.mu.Lock()
		c.list = append(c.list, ctx)
		c.mu.Unlock()
		return reply(ctx, n)
	}
}

// A StallTimeout times a stream by its output: a healthy stream runs as
// long as it keeps sending, one that stalls before its first chunk is
// retried, and one that stalls after output is returned at once.
func TestDoStallTimeout(t *testing.T) {
	const stallTimeout = 300 * ms
	tests := []struct {
		name      string
		reply     func(context.Context, int) error
		timeout   time.Duration // Backend.Timeout
		want      string        // Do's answer; "" when it fails
		wantCalls []time.Duration
		wantEnd   time.Duration // when Do returns
		wantFirst llmretry.Attempt
	}{
		{
			// 20 chunks, 100ms apart: 2s in all, far past the stall timeout.
			name:      "healthy_stream",
			reply:     stream(20, 100*ms, false),
			want:      "a: hi",
			wantCalls: []time.Duration{0},
			wantEnd:   2 * time.Second,
			wantFirst: llmretry.Attempt{Model: "a", Try: 1, Elapsed: 2 * time.Second, Delivered: true},
		},
		{
			name:      "hang_before_first_chunk",
			reply:     hangFirst,
			want:      "a: hi",
			wantCalls: []time.Duration{0, stallTimeout},
			wantEnd:   stallTimeout + 300*ms,
			wantFirst: llmretry.Attempt{
				Model: "a", Try: 1, Kind: llmretry.KindTimeout, Err: llmretry.ErrStalled, Elapsed: stallTimeout,
				Next: llmretry.NextRetry,
			},
		},
		{
			// SDKs often return ctx.Err(), which is context.Canceled for a
			// stall: the chain knows its own timer ended the attempt.
			name:      "hang_returns_ctx_err",
			reply:     firstThen(hang),
			want:      "a: hi",
			wantCalls: []time.Duration{0, stallTimeout},
			wantEnd:   stallTimeout + 300*ms,
			wantFirst: llmretry.Attempt{
				Model: "a", Try: 1, Kind: llmretry.KindTimeout, Err: context.Canceled, Elapsed: stallTimeout,
				Next: llmretry.NextRetry,
			},
		},
		{
			// A timeout, whatever error the backend wraps the stall in.
			name:      "hang_blames_request",
			reply:     firstThen(func(ctx context.Context, _ int) error { <-ctx.Done(); return errBlame }),
			want:      "a: hi",
			wantCalls: []time.Duration{0, stallTimeout},
			wantEnd:   stallTimeout + 300*ms,
			wantFirst: llmretry.Attempt{
				Model: "a", Try: 1, Kind: llmretry.KindTimeout, Status: 400, Err: errBlame, Elapsed: stallTimeout,
				Next: llmretry.NextRetry,
			},
		},
		{
			name:      "stall_after_three_chunks",
			reply:     stream(3, 100*ms, true),
			wantCalls: []time.Duration{0},
			wantEnd:   300*ms + stallTimeout,
			wantFirst: llmretry.Attempt{
				Model: "a", Try: 1, Kind: llmretry.KindTimeout, Err: llmretry.ErrStalled, Elapsed: 300*ms + stallTimeout,
				Next: llmretry.NextStop, Why: llmretry.WhyDelivered, Delivered: true,
			},
		},
		{
			// Progress keeps a buffered stream alive as Delivered does a
			// streamed one, without marking it delivered.
			name:      "buffered_healthy_stream",
			reply:     buffered(20, 100*ms, false),
			want:      "a: hi",
			wantCalls: []time.Duration{0},
			wantEnd:   2 * time.Second,
			wantFirst: llmretry.Attempt{Model: "a", Try: 1, Elapsed: 2 * time.Second},
		},
		{
			// The caller holds nothing of a buffered stream, so a stall
			// after progress is retried, timed from the last progress.
			name:      "buffered_stall_after_three_chunks",
			reply:     firstThen(buffered(3, 100*ms, true)),
			want:      "a: hi",
			wantCalls: []time.Duration{0, 300*ms + stallTimeout},
			wantEnd:   300*ms + stallTimeout + 300*ms,
			wantFirst: llmretry.Attempt{
				Model: "a", Try: 1, Kind: llmretry.KindTimeout, Err: llmretry.ErrStalled, Elapsed: 300*ms + stallTimeout,
				Next: llmretry.NextRetry,
			},
		},
		{
			// Timeout still bounds the attempt as a whole.
			name:      "timeout_bounds_healthy_stream",
			reply:     stream(20, 100*ms, false),
			timeout:   time.Second,
			wantCalls: []time.Duration{0},
			wantEnd:   time.Second,
			wantFirst: llmretry.Attempt{
				Model: "a", Try: 1, Kind: llmretry.KindTimeout, Err: llmretry.ErrAttemptTimeout, Elapsed: time.Second,
				Next: llmretry.NextStop, Why: llmretry.WhyDelivered, Delivered: true,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var got ctxs
				a, b := newFake("a", got.wrap(tc.reply)), newFake("b", answers)
				rec := newRecorder()
				c := &chain{
					Backends: []backend{
						{Model: "a", Call: a.Call, Retry: waits(0, 0), StallTimeout: stallTimeout, Timeout: tc.timeout},
						{Model: "b", Call: b.Call},
					},
					OnAttempt: rec.OnAttempt,
				}

				resp, err := c.Do(context.Background(), "hi")
				if end := time.Since(start); end != tc.wantEnd {
					t.Errorf("Do() returned after %v, want %v", end, tc.wantEnd)
				}
				if tc.want != "" {
					if resp != tc.want || err != nil {
						t.Errorf("Do() = %q, %v, want %q, nil", resp, err, tc.want)
					}
				} else {
					var to *llmretry.TimedOut
					if !errors.As(err, &to) || !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Do() = %v (%T), want a *TimedOut", err, err)
					}
					if n := len(recordsOf(t, err)); n != 1 {
						t.Errorf("Do() error has %d records, want 1", n)
					}
				}
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("backend a calls (-want +got):\n%s", diff)
				}
				if got := b.times(); got != nil {
					t.Errorf("backend b calls = %v, want none", got)
				}
				seen, _ := rec.seen()
				if diff := cmp.Diff(tc.wantFirst, seen[0], attemptOpts, cmpopts.IgnoreFields(llmretry.Attempt{}, "Start")); diff != "" {
					t.Errorf("first attempt (-want +got):\n%s", diff)
				}

				// Nothing the chain started outlives Do: every attempt's context
				// is done, so goroutines that watch it end, and an hour later no
				// stall timer has fired into a context it no longer owns.
				for i, ctx := range got.list {
					if ctx.Err() == nil {
						t.Errorf("attempt %d context still live after Do returned", i+1)
					}
				}
				causes := make([]error, len(got.list))
				for i, ctx := range got.list {
					causes[i] = context.Cause(ctx)
				}
				time.Sleep(time.Hour)
				synctest.Wait()
				for i, ctx := range got.list {
					if cause := context.Cause(ctx); cause != causes[i] {
						t.Errorf("attempt %d context cause = %v an hour after Do, want %v as when Do returned", i+1, cause, causes[i])
					}
				}
				if got := a.times(); len(got) != len(tc.wantCalls) {
					t.Errorf("backend a calls = %v after an hour, want %v", got, tc.wantCalls)
				}
			})
		})
	}
}

// A stall that ends an attempt with no retry left is a TimedOut whose
// lever is the backends' limits, not a deadline the caller never set.
func TestDoStallWithoutRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", hangFirst).Call, StallTimeout: 300 * ms}}}

		_, err := c.Do(context.Background(), "hi")
		if end := time.Since(start); end != 300*ms {
			t.Errorf("Do() returned after %v, want 300ms", end)
		}
		// ErrStalled is the attempt's error, kept in its record; the
		// outcome's tree holds the timeout alone.
		if !isTimedOut(err) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, llmretry.ErrStalled) || !lastErrIs(err, llmretry.ErrStalled) {
			t.Errorf("Do() = %v (%T), want a *TimedOut matching context.DeadlineExceeded, with ErrStalled in its last record only", err, err)
		}
		if !errors.Is(llmretry.ErrStalled, context.DeadlineExceeded) || llmretry.Classify(llmretry.ErrStalled) != llmretry.KindTimeout {
			t.Errorf("ErrStalled does not match context.DeadlineExceeded or classify as timeout")
		}
	})
}

func TestValidateStallTimeout(t *testing.T) {
	c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", answers).Call, StallTimeout: -ms}}}
	err := c.Validate()
	if !errors.Is(err, llmretry.ErrConfig) {
		t.Errorf("Validate() = %v, want an ErrConfig error for a negative StallTimeout", err)
	}
}

// Standalone lets a chain that a backend calls for another purpose retry
// by its own policy; without it, the inner chain makes one attempt per
// backend.
func TestStandaloneRetriesOnItsOwn(t *testing.T) {
	tests := []struct {
		name       string
		standalone bool
		wantInner  []time.Duration // calls of the inner chain's backend
		wantOuter  int             // attempts of the outer chain
	}{
		{name: "nested", wantInner: []time.Duration{0, 10 * ms, 30 * ms}, wantOuter: 3},
		{name: "standalone", standalone: true, wantInner: []time.Duration{0, 10 * ms, 20 * ms}, wantOuter: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				mod := newFake("moderation", script(busy("1"), busy("2")))
				moderation := &chain{Backends: []backend{{Model: "moderation", Call: mod.Call, Retry: waits(10*ms, 10*ms)}}}
				call := func(ctx context.Context, req string) (string, error) {
					if tc.standalone {
						ctx = llmretry.Standalone(ctx)
					}
					if _, err := moderation.Do(ctx, req); err != nil {
						return "", err
					}
					return "answer: " + req, nil
				}
				rec := newRecorder()
				outer := &chain{
					Backends:  []backend{{Model: "lm", Call: call, Retry: waits(10*ms, 20*ms)}},
					OnAttempt: rec.OnAttempt,
				}

				got, err := outer.Do(context.Background(), "hi")
				if got != "answer: hi" || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "answer: hi")
				}
				if diff := cmp.Diff(tc.wantInner, mod.times()); diff != "" {
					t.Errorf("inner backend calls (-want +got):\n%s", diff)
				}
				if seen, _ := rec.seen(); len(seen) != tc.wantOuter {
					t.Errorf("outer attempts = %d, want %d", len(seen), tc.wantOuter)
				}
			})
		})
	}
}

// Under Standalone, the inner chain's Delivered does not mark the
// enclosing attempt, which may then be retried; without it, it does.
func TestStandaloneDeliveredStaysInside(t *testing.T) {
	lmBusy := busy("lm busy")
	tests := []struct {
		name       string
		standalone bool
		want       string // Do's answer; "" when it fails
		wantFirst  llmretry.Attempt
	}{
		{
			name:      "nested",
			wantFirst: llmretry.Attempt{Model: "lm", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: lmBusy, Next: llmretry.NextStop, Why: llmretry.WhyDelivered, Delivered: true},
		},
		{
			name:       "standalone",
			standalone: true,
			want:       "answer: hi",
			wantFirst:  llmretry.Attempt{Model: "lm", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: lmBusy, Next: llmretry.NextRetry, RetryIn: 10 * ms},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				emb := newFake("embed", func(ctx context.Context, _ int) error {
					llmretry.Delivered(ctx) // the embedding chain streams to its own caller
					return nil
				})
				embed := &chain{Backends: []backend{{Model: "embed", Call: emb.Call}}}
				lm := newFake("lm", script(lmBusy))
				call := func(ctx context.Context, req string) (string, error) {
					ectx := ctx
					if tc.standalone {
						ectx = llmretry.Standalone(ctx)
					}
					if _, err := embed.Do(ectx, req); err != nil {
						return "", err
					}
					if _, err := lm.Call(ctx, req); err != nil {
						return "", err
					}
					return "answer: " + req, nil
				}
				rec := newRecorder()
				outer := &chain{
					Backends:  []backend{{Model: "lm", Call: call, Retry: waits(10 * ms)}},
					OnAttempt: rec.OnAttempt,
				}

				got, err := outer.Do(context.Background(), "hi")
				if tc.want != "" && (got != tc.want || err != nil) {
					t.Errorf("Do() = %q, %v, want %q, nil", got, err, tc.want)
				}
				if tc.want == "" && err == nil {
					t.Errorf("Do() = %q, nil, want an error", got)
				}
				seen, _ := rec.seen()
				if diff := cmp.Diff(tc.wantFirst, seen[0], attemptOpts, ignoreTimes); diff != "" {
					t.Errorf("first outer attempt (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// Cancellation still flows through Standalone.
func TestStandaloneKeepsCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		inner := &chain{Backends: []backend{{Model: "x", Call: newFake("x", hang).Call, Retry: waits(ms)}}}
		outer := &chain{Backends: []backend{{Model: "y", Call: func(ctx context.Context, req string) (string, error) {
			return inner.Do(llmretry.Standalone(ctx), req)
		}, Retry: waits(ms)}}}

		_, err := outer.Do(ctx, "hi")
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Do() = %v, want a *Cancelled", err)
		}
	})
}

// BenchmarkDelivered measures the call a streaming backend makes for every
// chunk, with and without a StallTimeout to restart.
func BenchmarkDelivered(b *testing.B) {
	benchmarks := []struct {
		name  string
		stall time.Duration
	}{
		{"plain", 0},
		{"stall_timeout", time.Minute},
	}
	for _, bm := range benchmarks {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			c := &chain{Backends: []backend{{Model: "a", StallTimeout: bm.stall, Call: func(ctx context.Context, req string) (string, error) {
				for b.Loop() {
					llmretry.Delivered(ctx)
				}
				return req, nil
			}}}}
			if _, err := c.Do(context.Background(), "hi"); err != nil {
				b.Fatal(err)
			}
		})
	}
}
