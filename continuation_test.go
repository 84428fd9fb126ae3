package llmretry_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// answerText is the answer the story backends tell, in pieces of a word.
const answerText = "The sky is blue because air scatters blue light most."

// story is a backend that streams answerText a word at a time through
// Emit and, asked to continue, streams only what follows what the caller
// holds, answering with the whole text. cuts[n] is how many pieces call n
// (from 0) streams before it fails with err; a call past the list, or
// with a negative cut, answers.
type story struct {
	cuts []int
	errs []error // how each cut call fails; busy when nil or past the list

	mu     sync.Mutex
	calls  int
	conts  []*llmretry.Continuation // what each call was asked to continue, nil for none
	resume int                      // the first resume calls leave their call number as their resume state
}

func (s *story) call(ctx context.Context, _ string) (string, error) {
	s.mu.Lock()
	n := s.calls
	s.calls++
	cut := -1
	if n < len(s.cuts) {
		cut = s.cuts[n]
	}
	c, ok := llmretry.Continuing(ctx)
	if ok {
		s.conts = append(s.conts, &c)
	} else {
		s.conts = append(s.conts, nil)
	}
	s.mu.Unlock()
	if !strings.HasPrefix(answerText, c.Text) {
		return "", errors.New("asked to continue text that is not the answer's")
	}
	if n < s.resume {
		llmretry.SetResume(ctx, n)
	}
	for i, w := range strings.SplitAfter(answerText[len(c.Text):], " ") {
		if i == cut {
			if n < len(s.errs) && s.errs[n] != nil {
				return "", s.errs[n]
			}
			return "", busy("stream cut")
		}
		llmretry.Emit(ctx, w)
	}
	return answerText, nil
}

// continued returns what each call was asked to continue.
func (s *story) continued() []*llmretry.Continuation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conts
}

// canAlways says a backend can continue any answer.
func canAlways(llmretry.Continuation) bool { return true }

// outline is a record as model, next, why, continued-from bytes and
// restarted, for comparison.
type outline struct {
	Model     string
	Next      llmretry.Next
	Why       llmretry.Why
	From      int
	Restarted bool
}

func outlines(as []llmretry.Attempt) []outline {
	var o []outline
	for _, a := range as {
		o = append(o, outline{a.Model, a.Next, a.Why, a.ContinuedFrom, a.Restarted})
	}
	return o
}

// assembled is the text a stream holds at the end: what came after its
// last restart.
func assembled(chunks []llmretry.Chunk) string {
	var b strings.Builder
	for _, c := range chunks {
		if c.Restart {
			b.Reset()
		}
		b.WriteString(c.Text)
	}
	return b.String()
}

// refusedPrefill is a model's 400 to a continuation it does not take.
var refusedPrefill = llmretry.StatusFailure(400, nil, errors.Join(errors.New("prefill refused"), llmretry.ErrCannotContinue))

// The first three words, as a cut after three pieces leaves them with the
// caller.
var firstThree = len("The sky is ")

// With Continue, a stream that fails after delivering text goes on from
// it: on the same backend when it can continue, else on the next that
// can, passing over those that cannot; with Restart, where none can, the
// stream is told to start again and gets a whole new answer. Without
// either, the call stops as it canAlways has.
func TestContinue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		continue_ bool
		restart   bool
		a, b, c   *story // the chain's backends; nil for none
		canA      func(llmretry.Continuation) bool
		canB      func(llmretry.Continuation) bool
		canC      func(llmretry.Continuation) bool
		want      []outline
		ok        bool // Do answers
		restarts  int  // Restart chunks the stream got
	}{
		{
			name: "off",
			a:    &story{cuts: []int{3}}, canA: canAlways,
			want: []outline{{Model: "a", Next: llmretry.NextStop, Why: llmretry.WhyDelivered}},
		},
		{
			name: "same_backend", continue_: true,
			a: &story{cuts: []int{3}}, canA: canAlways,
			want: []outline{{Model: "a", Next: llmretry.NextRetry}, {Model: "a", From: firstThree}},
			ok:   true,
		},
		{
			name: "twice", continue_: true,
			a: &story{cuts: []int{3, 2}}, canA: canAlways,
			want: []outline{{Model: "a", Next: llmretry.NextRetry}, {Model: "a", Next: llmretry.NextRetry, From: firstThree}, {Model: "a", From: len("The sky is blue because ")}},
			ok:   true,
		},
		{
			name: "next_backend_that_can", continue_: true,
			a: &story{cuts: []int{3}}, b: &story{}, c: &story{}, canC: canAlways,
			// b cannot continue: passed over without a request.
			want: []outline{{Model: "a", Next: llmretry.NextFailOver, Why: llmretry.WhyCannotContinue}, {Model: "c", From: firstThree}},
			ok:   true,
		},
		{
			name: "none_can", continue_: true,
			a: &story{cuts: []int{3}}, b: &story{},
			want: []outline{{Model: "a", Next: llmretry.NextStop, Why: llmretry.WhyDelivered}},
		},
		{
			name: "restart", restart: true,
			a:    &story{cuts: []int{3}},
			want: []outline{{Model: "a", Next: llmretry.NextRetry}, {Model: "a", Restarted: true}},
			ok:   true, restarts: 1,
		},
		{
			name: "continue_before_restart", continue_: true, restart: true,
			a: &story{cuts: []int{3}}, b: &story{}, canB: canAlways,
			want: []outline{{Model: "a", Next: llmretry.NextFailOver, Why: llmretry.WhyCannotContinue}, {Model: "b", From: firstThree}},
			ok:   true,
		},
		{
			// The backend refuses the continuation: learned for the call,
			// and the answer starts again on it.
			name: "refused_continuation_restarts", continue_: true, restart: true,
			a: &story{cuts: []int{3, 0}, errs: []error{nil, refusedPrefill}}, canA: canAlways,
			want: []outline{
				{Model: "a", Next: llmretry.NextRetry},
				{Model: "a", Next: llmretry.NextRetry, From: firstThree},
				{Model: "a", Restarted: true},
			},
			ok: true, restarts: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			backends := []backend{{Model: "a", Call: tc.a.call, CanContinue: tc.canA, Retry: waits(0, 0, 0)}}
			if tc.b != nil {
				backends = append(backends, backend{Model: "b", Call: tc.b.call, CanContinue: tc.canB})
			}
			if tc.c != nil {
				backends = append(backends, backend{Model: "c", Call: tc.c.call, CanContinue: tc.canC})
			}
			rec := newRecorder()
			c := &chain{Backends: backends, Continue: tc.continue_, Restart: tc.restart, OnAttempt: rec.OnAttempt}
			var chunks []llmretry.Chunk
			answer, err := c.Do(llmretry.WithStream(context.Background(), func(ch llmretry.Chunk) { chunks = append(chunks, ch) }), "q")
			seen, _ := rec.seen()
			if diff := cmp.Diff(tc.want, outlines(seen)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			restarts := 0
			for _, ch := range chunks {
				if ch.Restart {
					restarts++
				}
			}
			if restarts != tc.restarts {
				t.Errorf("the stream got %d restarts, want %d", restarts, tc.restarts)
			}
			if tc.ok {
				if err != nil || answer != answerText {
					t.Fatalf("Do() = %q, %v; want the whole answer", answer, err)
				}
				if got := assembled(chunks); got != answerText {
					t.Errorf("the stream assembled %q, want %q", got, answerText)
				}
				return
			}
			if err == nil {
				t.Fatalf("Do() = %q, want an error: the answer is not whole", answer)
			}
		})
	}
}

// What a backend is told to continue: the text the caller holds, and the
// resume state its own last attempt left, until an attempt that left none
// delivered more; a backend that did not stream the answer gets no resume
// state.
func TestContinuationResume(t *testing.T) {
	t.Parallel()
	a := &story{cuts: []int{3, 2}, resume: 1}
	c := &chain{Backends: []backend{{Model: "a", Call: a.call, CanContinue: canAlways, Retry: waits(0, 0)}}, Continue: true}
	if got, err := c.Do(context.Background(), "q"); err != nil || got != answerText {
		t.Fatalf("Do() = %q, %v; want the whole answer", got, err)
	}
	want := []*llmretry.Continuation{nil, {Text: "The sky is ", Resume: 0}, {Text: "The sky is blue because "}}
	if diff := cmp.Diff(want, a.continued()); diff != "" {
		t.Errorf("a was asked to continue (-want +got):\n%s", diff)
	}

	a, b := &story{cuts: []int{3}, resume: 1}, &story{}
	c = &chain{
		Backends: []backend{{Model: "a", Call: a.call, CanContinue: canAlways}, {Model: "b", Call: b.call, CanContinue: canAlways}},
		Continue: true,
	}
	if got, err := c.Do(context.Background(), "q"); err != nil || got != answerText {
		t.Fatalf("Do() = %q, %v; want the whole answer", got, err)
	}
	want = []*llmretry.Continuation{{Text: "The sky is "}}
	if diff := cmp.Diff(want, b.continued()); diff != "" {
		t.Errorf("b was asked to continue (-want +got):\n%s", diff)
	}
}

// Continuation never takes an answer that ended for a reason about it, nor
// one whose delivered text the chain does not know.
func TestContinueLimits(t *testing.T) {
	t.Parallel()
	truncated := func(ctx context.Context, _ string) (string, error) {
		llmretry.Emit(ctx, "The answer is")
		return "", llmretry.Truncation("The answer is")
	}
	bare := func(ctx context.Context, _ string) (string, error) {
		llmretry.Delivered(ctx)
		return "", busy("cut")
	}
	for name, call := range map[string]func(context.Context, string) (string, error){"truncated": truncated, "bare_delivered": bare} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder()
			c := &chain{
				Backends:  []backend{{Model: "a", Call: call, CanContinue: canAlways, Retry: waits(0)}, {Model: "b", Call: newFake("b", answers).Call, CanContinue: canAlways}},
				Continue:  true,
				Restart:   true,
				OnAttempt: rec.OnAttempt,
			}
			if _, err := c.Do(llmretry.WithStream(context.Background(), func(llmretry.Chunk) {}), "q"); err == nil {
				t.Fatal("Do() = nil error, want the first attempt's")
			}
			seen, _ := rec.seen()
			want := []outline{{Model: "a", Next: llmretry.NextStop, Why: llmretry.WhyDelivered}}
			if diff := cmp.Diff(want, outlines(seen)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// Restart needs a stream to tell: without one the call stops, and
// Chain.Stream yields the restart.
func TestRestartNeedsAStream(t *testing.T) {
	t.Parallel()
	a := &story{cuts: []int{3}}
	c := &chain{Backends: []backend{{Model: "a", Call: a.call, Retry: waits(0)}}, Restart: true}
	if _, err := c.Do(context.Background(), "q"); err == nil {
		t.Error("Do() without a stream = nil error, want the cut's: no stream to tell of a restart")
	}
	a = &story{cuts: []int{3}}
	c.Backends[0].Call = a.call
	var got []llmretry.Chunk
	for chunk, err := range c.Stream(context.Background(), "q") {
		if err != nil {
			t.Fatalf("Stream yielded %v, want the restarted answer", err)
		}
		got = append(got, chunk)
	}
	if n := len(got); n < 4 || !got[3].Restart || assembled(got) != answerText {
		t.Errorf("Stream yielded %v, want three pieces, a restart and the whole answer", got)
	}
}
