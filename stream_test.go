package llmretry_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// emitting is a backend that hands pieces to Emit, one every interval,
// and answers with them joined; with failAfter >= 0, it fails with err
// after that many pieces instead.
func emitting(pieces []string, every time.Duration, failAfter int, err error) func(context.Context, string) (string, error) {
	return func(ctx context.Context, _ string) (string, error) {
		for i, p := range pieces {
			if i == failAfter {
				return "", err
			}
			if every > 0 {
				t := time.NewTimer(every)
				select {
				case <-ctx.Done():
					t.Stop()
					return "", context.Cause(ctx)
				case <-t.C:
				}
			}
			llmretry.Emit(ctx, p)
		}
		if failAfter == len(pieces) {
			return "", err
		}
		return strings.Join(pieces, ""), nil
	}
}

// collect is a stream that keeps what it is handed.
type collect struct {
	mu     sync.Mutex
	chunks []llmretry.Chunk
}

func (c *collect) add(ch llmretry.Chunk) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.chunks = append(c.chunks, ch)
}

func (c *collect) texts() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ts []string
	for _, ch := range c.chunks {
		ts = append(ts, ch.Text)
	}
	return ts
}

// A call under WithStream hands each piece a backend emits to its own
// function, in order, before Do returns the answer; the record says it
// was delivered, and a failure after delivery is not sent again.
func TestWithStream(t *testing.T) {
	t.Parallel()
	cut := busy("stream cut")
	tests := []struct {
		name    string
		a       func(context.Context, string) (string, error)
		want    []string // what the stream got
		answer  string   // Do's answer, "" for an error
		records []string // model and next of each record
	}{
		{
			name:    "answer",
			a:       emitting([]string{"The ", "sky ", "is ", "blue."}, 0, -1, nil),
			want:    []string{"The ", "sky ", "is ", "blue."},
			answer:  "The sky is blue.",
			records: []string{"a ok"},
		},
		{
			name:    "cut_before_text",
			a:       sequence(emitting([]string{"x"}, 0, 0, cut), emitting([]string{"Hi ", "there."}, 0, -1, nil)),
			want:    []string{"Hi ", "there."},
			answer:  "Hi there.",
			records: []string{"a retry", "a ok"},
		},
		{
			name:    "cut_after_text",
			a:       emitting([]string{"Hi ", "there."}, 0, 1, cut),
			want:    []string{"Hi "},
			records: []string{"a stop"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got collect
			rec := newRecorder()
			c := &chain{
				Backends:  []backend{{Model: "a", Call: tc.a, Retry: waits(0)}, {Model: "b", Call: newFake("b", answers).Call}},
				OnAttempt: rec.OnAttempt,
			}
			answer, err := c.Do(llmretry.WithStream(context.Background(), got.add), "q")
			if answer != tc.answer || (err == nil) != (tc.answer != "") {
				t.Errorf("Do() = %q, %v, want %q", answer, err, tc.answer)
			}
			if diff := cmp.Diff(tc.want, got.texts()); diff != "" {
				t.Errorf("stream (-want +got):\n%s", diff)
			}
			seen, _ := rec.seen()
			var records []string
			for _, a := range seen {
				if a.Err == nil {
					records = append(records, a.Model+" ok")
					if !a.Delivered {
						t.Errorf("answer's record has Delivered false, want true")
					}
					continue
				}
				records = append(records, a.Model+" "+string(a.Next))
			}
			if diff := cmp.Diff(tc.records, records); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// sequence runs calls in turn, the last one again once they run out.
func sequence(calls ...func(context.Context, string) (string, error)) func(context.Context, string) (string, error) {
	var (
		mu sync.Mutex
		n  int
	)
	return func(ctx context.Context, req string) (string, error) {
		mu.Lock()
		call := calls[min(n, len(calls)-1)]
		n++
		mu.Unlock()
		return call(ctx, req)
	}
}

// Chain.Stream yields the chunks, and the error of a call that failed as
// its last pair.
func TestChainStream(t *testing.T) {
	t.Parallel()
	c := &chain{Backends: []backend{{Model: "a", Call: emitting([]string{"Hi ", "there."}, 0, 1, busy("cut"))}}}
	var (
		texts []string
		errs  []error
	)
	for chunk, err := range c.Stream(context.Background(), "q") {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		texts = append(texts, chunk.Text)
	}
	if diff := cmp.Diff([]string{"Hi "}, texts); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if len(errs) != 1 {
		t.Fatalf("errors = %v, want Do's one", errs)
	}
	if got := exhausted(t, errs[0]); len(got) != 1 || got[0].Why != llmretry.WhyDelivered {
		t.Errorf("Do() records = %v, want one stopped as delivered", got)
	}

	c.Backends[0].Call = emitting([]string{"Hi ", "there."}, 0, -1, nil)
	texts = nil
	for chunk, err := range c.Stream(context.Background(), "q") {
		if err != nil {
			t.Fatalf("Stream yielded %v, want no error", err)
		}
		texts = append(texts, chunk.Text)
	}
	if diff := cmp.Diff([]string{"Hi ", "there."}, texts); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}

	var nilCtx context.Context // a caller's mistake the stream reports
	for _, err := range (&chain{}).Stream(nilCtx, "q") {
		if !errors.Is(err, llmretry.ErrConfig) {
			t.Errorf("Stream(nil) yielded %v, want an ErrConfig error", err)
		}
	}
}

// Breaking out of the loop over Chain.Stream cancels the call: the
// backend's context ends, Do returns, and nothing more is yielded.
func TestChainStreamBreak(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var ended error
		c := &chain{Backends: []backend{{Model: "a", Retry: waits(0, 0), Call: func(ctx context.Context, _ string) (string, error) {
			for i := 0; ; i++ {
				llmretry.Emit(ctx, "piece ")
				select {
				case <-ctx.Done():
					ended = context.Cause(ctx)
					return "", ctx.Err()
				case <-time.After(time.Second):
				}
			}
		}}}}
		n := 0
		for _, err := range c.Stream(context.Background(), "q") {
			if err != nil {
				t.Fatalf("Stream yielded %v after the loop broke", err)
			}
			if n++; n == 3 {
				break
			}
		}
		if ended == nil {
			t.Fatal("backend's context still live after the loop broke, want it cancelled")
		}
		if !strings.Contains(ended.Error(), "stream stopped") {
			t.Errorf("backend's context cause = %v, want the loop's stop", ended)
		}
	})
}

// Emit reaches no stream from a goroutine the backend left behind once
// its Call has returned, nor outside an attempt; an empty piece is
// nothing.
func TestEmitBounds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var got collect
		rec := newRecorder()
		c := &chain{
			Backends: []backend{{Model: "a", Call: func(ctx context.Context, _ string) (string, error) {
				llmretry.Emit(ctx, "")
				go func() {
					time.Sleep(time.Second)
					llmretry.Emit(ctx, "late")
				}()
				return "answer", nil
			}}},
			OnAttempt: rec.OnAttempt,
		}
		ctx := llmretry.WithStream(context.Background(), got.add)
		if _, err := c.Do(ctx, "q"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		llmretry.Emit(ctx, "outside")
		llmretry.Emit(context.Background(), "outside")
		if texts := got.texts(); texts != nil {
			t.Errorf("stream got %q, want nothing", texts)
		}
		if seen, _ := rec.seen(); seen[0].Delivered {
			t.Error("record of an attempt that emitted nothing has Delivered true")
		}
	})
	if ctx := llmretry.WithStream(context.Background(), nil); ctx != context.Background() {
		t.Error("WithStream(ctx, nil) is not ctx")
	}
}

// Streaming says whether the call streams; a nested chain streams to the
// caller's stream, once, and marks the enclosing attempt delivered; a
// Standalone one does not see the stream.
func TestStreamingNested(t *testing.T) {
	t.Parallel()
	var streaming []bool
	probe := func(ctx context.Context, _ string) (string, error) {
		streaming = append(streaming, llmretry.Streaming(ctx))
		llmretry.Emit(ctx, "inner ")
		return "inner", nil
	}
	inner := &chain{Backends: []backend{{Model: "in", Call: probe}}}
	rec := newRecorder()
	outer := &chain{
		Backends: []backend{{Model: "out", Call: func(ctx context.Context, req string) (string, error) {
			if _, err := inner.Do(ctx, req); err != nil {
				return "", err
			}
			if _, err := inner.Do(llmretry.Standalone(ctx), req); err != nil {
				return "", err
			}
			return "outer", nil
		}}},
		OnAttempt: rec.OnAttempt,
	}
	var got collect
	if _, err := outer.Do(llmretry.WithStream(context.Background(), got.add), "q"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"inner "}, got.texts()); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]bool{true, false}, streaming); diff != "" {
		t.Errorf("Streaming in the nested and the standalone chain (-want +got):\n%s", diff)
	}
	if seen, _ := rec.seen(); !seen[0].Delivered {
		t.Error("outer record has Delivered false, want true: the nested chain emitted")
	}
	streaming = nil
	if _, err := outer.Do(context.Background(), "q"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]bool{false, false}, streaming); diff != "" {
		t.Errorf("Streaming without a stream (-want +got):\n%s", diff)
	}
}

// The time the stream's consumer takes with a piece is not the backend's
// silence: a slow consumer does not stall the attempt.
func TestStreamSlowConsumerIsNotAStall(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := &chain{Backends: []backend{{
			Model:        "a",
			Call:         emitting([]string{"one ", "two ", "three"}, 100*ms, -1, nil),
			StallTimeout: 300 * ms,
		}}}
		slow := func(llmretry.Chunk) { time.Sleep(time.Second) }
		if _, err := c.Do(llmretry.WithStream(context.Background(), slow), "q"); err != nil {
			t.Errorf("Do() = %v, want the answer: the consumer's time is not a stall", err)
		}
	})
}
