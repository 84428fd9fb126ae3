package llmretry

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file holds the context an attempt runs under: the mark that nested
// chains and Delivered find, the stall timer, and the attempt's own
// limits.

// markKey finds the innermost attempt mark in a context.
type markKey struct{}

// attemptCtx is the context a backend's Call receives: the caller's
// context (or the attempt's own, under a Timeout or StallTimeout) plus the
// attempt's mark. The context package still finds the parent's
// cancellation through Value, so no goroutine is started to propagate it.
type attemptCtx struct {
	context.Context
	parent    *attemptCtx   // the enclosing chain's attempt, for nested chains
	retrying  bool          // this attempt or one enclosing it may be retried: nested chains must not retry
	delivered atomic.Bool   // output has reached the caller: never resend
	output    atomic.Bool   // the attempt has produced output, delivered or not (Delivered, Progress): it is not silent
	stall     *stallTimer   // ends the attempt when no output comes; nil without a StallTimeout
	sent      time.Time     // when the attempt was sent: the send of every rate-limit report it makes
	sink      *sink         // the call's stream, nil when the call does not stream
	cont      *Continuation // what the attempt continues (Continuing); nil when it begins the answer
	bare      atomic.Bool   // Delivered was called: text reached the caller that Emit did not see

	emitMu sync.Mutex // guards ended, and orders Emit's pieces
	ended  bool       // the Call has returned: Emit does nothing more

	textMu    sync.Mutex      // guards text, resume and resumeSet
	text      strings.Builder // what the attempt handed to Emit, in order
	resume    any             // the attempt's last SetResume
	resumeSet bool            // SetResume was called

	limitsMu  sync.Mutex  // guards limits, hasLimits, own and nested
	limits    limitReport // the freshest rate-limit report of the attempt's responses
	hasLimits bool        // limits holds a report
	own       *Usage      // the last usage the Call reported itself; nil when none
	nested    *Usage      // the sum of what the chains run under the attempt cost; nil when none reported
}

// Value returns the attempt itself for markKey and asks the parent
// otherwise.
func (a *attemptCtx) Value(key any) any {
	if _, ok := key.(markKey); ok {
		return a
	}
	return a.Context.Value(key)
}

// stallTimer ends an attempt that goes StallTimeout without output.
type stallTimer struct {
	d    time.Duration
	mu   sync.Mutex
	t    *time.Timer
	done bool
}

// touch restarts the timer: the attempt has just produced output.
func (s *stallTimer) touch() {
	s.mu.Lock()
	if !s.done {
		s.t.Reset(s.d)
	}
	s.mu.Unlock()
}

// hold stops the timer until the next touch: the attempt's output is
// with the caller, and the backend reads nothing until it is back.
func (s *stallTimer) hold() {
	s.mu.Lock()
	if !s.done {
		s.t.Stop()
	}
	s.mu.Unlock()
}

// stop stops the timer for good.
func (s *stallTimer) stop() {
	s.mu.Lock()
	s.done = true
	s.t.Stop()
	s.mu.Unlock()
}

// Delivered tells the chain that the attempt running under ctx has handed
// output to the caller, such as a streamed chunk. From then on a failure
// of that attempt is returned at once: it is not sent again and no other
// backend is tried, because the caller already holds part of an answer. A
// streaming backend calls it with every chunk it hands over, which also
// restarts the attempt's [Backend.StallTimeout]. In nested chains it marks
// every enclosing chain's attempt too, up to a [Standalone] context. With
// a context that is not an attempt's, Delivered does nothing. It is safe
// to call from any goroutine, and as often as needed. A backend that
// hands over text calls [Emit] instead, which marks the attempt as
// Delivered does and hands the text to the call's stream. A hook set with
// [OnProgress] hears of each call.
func Delivered(ctx context.Context) {
	if ctx == nil {
		return
	}
	a, _ := ctx.Value(markKey{}).(*attemptCtx)
	if a == nil {
		return
	}
	for ; a != nil; a = a.parent {
		a.delivered.Store(true)
		a.output.Store(true)
		// What reached the caller is not known: the call cannot go on
		// from it.
		a.bare.Store(true)
		if a.stall != nil {
			a.stall.touch()
		}
	}
	progressed(ctx)
}

// emit marks the attempt and every enclosing one delivered, as Delivered
// does, and hands text to the call's stream, holding the stall timers
// while the stream's consumer has it.
func (a *attemptCtx) emit(text string) {
	a.emitMu.Lock()
	defer a.emitMu.Unlock()
	if a.ended {
		return
	}
	for m := a; m != nil; m = m.parent {
		m.delivered.Store(true)
		m.output.Store(true)
		m.textMu.Lock()
		m.text.WriteString(text)
		m.textMu.Unlock()
		if m.stall != nil {
			m.stall.hold()
		}
	}
	if a.sink != nil {
		a.sink.send(Chunk{Text: text})
	}
	for m := a; m != nil; m = m.parent {
		if m.stall != nil {
			m.stall.touch()
		}
	}
}

// end marks the attempt's Call returned: from now on Emit does nothing,
// and once end returns no piece is on its way to the stream. It returns
// what the attempt emitted, and the resume state it left, if it set one.
func (a *attemptCtx) end() (emitted string, resume any, resumeSet bool) {
	a.emitMu.Lock()
	a.ended = true
	a.emitMu.Unlock()
	a.textMu.Lock()
	defer a.textMu.Unlock()
	return a.text.String(), a.resume, a.resumeSet
}

// Progress tells the chain that the attempt running under ctx is making
// progress without handing output to the caller, such as a chunk of a
// stream that the backend buffers and returns whole. It restarts the
// attempt's [Backend.StallTimeout], so a stall is measured as time
// without progress, but it does not mark the attempt delivered: a
// failure after progress is retried or failed over like any other,
// because the caller holds nothing of it. In nested chains it restarts
// every enclosing chain's attempt's timer too, up to a [Standalone]
// context. With a context that is not an attempt's, Progress does
// nothing. It is safe to call from any goroutine, and as often as needed.
// A hook set with [OnProgress] hears of each call.
func Progress(ctx context.Context) {
	if ctx == nil {
		return
	}
	a, _ := ctx.Value(markKey{}).(*attemptCtx)
	if a == nil {
		return
	}
	for ; a != nil; a = a.parent {
		a.output.Store(true)
		if a.stall != nil {
			a.stall.touch()
		}
	}
	progressed(ctx)
}

// ReportLimits tells the chain what a response's header h says of the
// provider's rate limits, for the [Breaker] of the backend whose attempt
// runs under ctx to pace its requests by. A backend's Call passes the
// header of every response it gets, success or failure, streaming or not,
// before it returns: the Breaker learns the attempt's report when the
// attempt ends (a stream's, when the stream does), and a report made
// after the Call returned is not seen. It reads OpenAI's and Azure OpenAI's
// x-ratelimit-{limit,remaining,reset}-{requests,tokens} and Anthropic's
// anthropic-ratelimit-*-{limit,remaining,reset}, with Retry-After; a
// header it cannot read is ignored, never an error. A Call that returns
// [StatusFailure] for a response need not call it for that response:
// StatusFailure reads the same headers.
//
// With a nil ctx or h, or a context that is not an attempt's, it does
// nothing. In nested chains it reports to the innermost attempt: the
// response is its backend's. It is safe to call from any goroutine, and
// as often as needed; of several reports the attempt keeps the freshest,
// as [Breaker] ranks them.
func ReportLimits(ctx context.Context, h http.Header) {
	if ctx == nil || h == nil {
		return
	}
	a, _ := ctx.Value(markKey{}).(*attemptCtx)
	if a == nil {
		return
	}
	r, ok := parseLimits(h, a.sent, time.Now())
	if ok {
		a.report(r)
	}
}

// report keeps r, when it is fresher than the attempt's report so far.
func (a *attemptCtx) report(r limitReport) {
	a.limitsMu.Lock()
	defer a.limitsMu.Unlock()
	if !a.hasLimits || fresher(&r, &a.limits) {
		a.limits, a.hasLimits = r, true
	}
}

// reported copies the attempt's freshest rate-limit report to dst, and
// reports whether it made one.
func (a *attemptCtx) reported(dst *limitReport) bool {
	a.limitsMu.Lock()
	defer a.limitsMu.Unlock()
	*dst = a.limits
	return a.hasLimits
}

// Standalone returns a context under which a Chain runs on its own: it
// retries by its own policies even inside another chain's attempt, its
// [Delivered] calls do not mark the enclosing attempt, and it does not
// stream to the enclosing call's stream ([WithStream]). Use it for an
// unrelated chain that a backend calls, such as moderation or embeddings;
// an LM that wraps an LM should pass its context on unchanged, so that
// retries do not multiply. Cancellation and deadlines still flow from ctx.
func Standalone(ctx context.Context) context.Context {
	if ctx == nil {
		return nil // Do then reports the nil context as it would any other
	}
	return standaloneCtx{ctx}
}

// standaloneCtx hides the enclosing attempt's mark.
type standaloneCtx struct{ context.Context }

func (s standaloneCtx) Value(key any) any {
	switch key.(type) {
	case markKey, streamKey:
		// Neither the enclosing attempt nor the caller's stream is the
		// unrelated chain's.
		return nil
	}
	return s.Context.Value(key)
}

// callLimited sends one request under the attempt's own limits, Timeout for the
// whole attempt and StallTimeout between outputs, and reports whether one
// of them ended it. Without either it calls the backend on the mark
// itself: the success path's one allocation.
func (b *Backend[Req, Resp]) callLimited(mark *attemptCtx, req Req) (resp Resp, err error, own bool) {
	if b.Timeout <= 0 && b.StallTimeout <= 0 {
		resp, err = b.Call(mark, req)
		return resp, err, false
	}
	ctx := mark.Context
	if b.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, b.Timeout, ErrAttemptTimeout)
		defer cancel()
	}
	if b.StallTimeout > 0 {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		mark.stall = &stallTimer{d: b.StallTimeout}
		mark.stall.t = time.AfterFunc(b.StallTimeout, func() { cancel(ErrStalled) })
		// Stopped before the context is cancelled, and for good: a
		// goroutine the backend left behind cannot re-arm it.
		defer mark.stall.stop()
	}
	mark.Context = ctx
	resp, err = b.Call(mark, req)
	cause := context.Cause(ctx)
	return resp, err, cause == ErrAttemptTimeout || cause == ErrStalled
}
