package llmretry

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// DefaultReserve is the most time a wait must leave before the caller's
// deadline when [Policy.Reserve] is zero: enough for one more request to a
// slow model to finish. A call whose context had less than twice that left
// when Do began reserves half of what it had instead, so that a short
// deadline still leaves room for retries.
const DefaultReserve = 60 * time.Second

// DefaultMaxWait is the longest retry-after hint a backend honours when
// [Policy.MaxWait] is zero. A longer hint ends the backend's retries.
const DefaultMaxWait = 5 * time.Minute

// minRepeat is the shortest wait that repeats under a deadline. A shorter
// positive last wait repeats at this length: repeated every millisecond, it
// would send thousands of requests to a provider that is already failing.
const minRepeat = time.Second

// ErrConfig is wrapped by every error that [Chain.Validate] and
// [Chain.Do] return for a chain that is set up wrong. Match it with
// errors.Is. Such errors advise [RetryItem] false: re-running an item
// against a broken chain fails the same way.
var ErrConfig = errors.New("llmretry: invalid configuration")

// ErrAttemptTimeout is the cause of an attempt's context when the
// backend's [Backend.Timeout] ends it. HTTP clients report it in their
// errors (net/http gives `Post "…": llmretry: attempt timeout`), so
// [Classify] of any error that wraps it is [KindTimeout], and
// errors.Is(ErrAttemptTimeout, context.DeadlineExceeded) is true.
var ErrAttemptTimeout error = &ownDeadline{"llmretry: attempt timeout"}

// ErrStalled is the cause of an attempt's context when the backend's
// [Backend.StallTimeout] ends it: no output for that long. Like
// [ErrAttemptTimeout], it classifies as [KindTimeout] and matches
// context.DeadlineExceeded.
var ErrStalled error = &ownDeadline{"llmretry: attempt stalled"}

// ownDeadline is the type of the causes the chain gives the contexts it
// ends on its own timers.
type ownDeadline struct{ msg string }

func (e *ownDeadline) Error() string { return e.msg }

// Is reports true for context.DeadlineExceeded: to everything above the
// backend, our own timer running out is a deadline.
func (e *ownDeadline) Is(target error) bool { return target == context.DeadlineExceeded }

// Timeout reports true, as net.Error timeouts do.
func (e *ownDeadline) Timeout() bool { return true }

// Policy says when one backend is tried again after a retryable failure.
// The zero Policy makes one attempt and no retries.
type Policy struct {
	// Waits are the waits before the 1st, 2nd, ... retry in this backend.
	// Without a deadline on the context, len(Waits) bounds the retries;
	// with one, the last wait repeats while Reserve still fits. A zero last
	// wait does not repeat, and a positive one shorter than a second
	// repeats at a second: repeats that fast would be a request storm.
	// Empty means no retries, and then the other fields must be zero.
	Waits []time.Duration
	// Reserve is the time that must remain before the context's deadline
	// after a wait, or the wait is not taken and the backend gives up.
	// 0 means DefaultReserve, but never more than half of the time the
	// context had left when Do began, so a 30s deadline reserves 15s;
	// negative means none, though a wait must still end before the
	// deadline.
	Reserve time.Duration
	// MaxWait caps a server's retry-after hint: a longer hint ends this
	// backend's retries instead of parking the caller. 0 means
	// DefaultMaxWait; negative means no cap.
	MaxWait time.Duration
	// Jitter spreads the waits: each wait w is drawn from
	// [w*(1-Jitter), w] (a repeated wait is still never under a second).
	// It must lie in [0, 1]; 0 means exact waits.
	Jitter float64
}

// Backend is one model in a [Chain]: how to call it and how hard to retry
// it.
type Backend[Req, Resp any] struct {
	// Model names the backend in attempt records and messages. Empty is
	// recorded as "unknown".
	Model string
	// Call sends one request. It receives a context carrying the chain's
	// attempt mark; pass that context on (to the HTTP request, to a nested
	// Chain) so that deadlines, cancellation, [Delivered] and nesting work.
	// To say how it failed, return a [*Failure] (or wrap one with %w).
	//
	// Call must return soon after its context is done, as net/http does.
	// Do waits for it: a Call that ignores its context holds Do past the
	// caller's cancel and past Timeout, and the chain can do nothing about
	// it from the calling goroutine. If such a Call then returns an
	// answer, Do returns it: the answer is there, and was paid for.
	Call func(ctx context.Context, req Req) (Resp, error)
	// Retry is the retry policy within this backend. The zero value makes
	// one attempt, no retries.
	Retry Policy
	// Timeout bounds each attempt as a whole; an attempt that hits it is
	// [KindTimeout], retried as the policy allows. 0 means none.
	Timeout time.Duration
	// StallTimeout is the longest an attempt may go without output: from
	// its start to its first [Delivered] call, and between later ones. A
	// streaming Call calls Delivered with every chunk it hands over, so a
	// healthy stream runs as long as it keeps sending, while one that
	// stalls is ended with [KindTimeout]: retried when nothing was
	// delivered yet, returned at once when something was. The attempt's
	// context is then cancelled with the cause [ErrStalled]: its Err is
	// context.Canceled, since a stall is not a deadline, and a failure is
	// recorded as timeout whatever error the Call returns. 0 means none.
	StallTimeout time.Duration
	// Breaker, when set, is the backend's health shared across calls: while
	// it is open, calls skip the backend (or, when it is the last they can
	// try, wait for it) instead of spending their own retries on it, and a
	// retry-after hint is the wait itself rather than a floor under the
	// policy's wait. Share one pointer among every chain that calls the
	// same deployment. nil means none.
	Breaker *Breaker
}

// Chain runs its backends in order: it retries within a backend after
// timed waits and fails over to the next backend when one gives up. A
// Chain is immutable once built and safe for concurrent Do calls; each
// call's state stays its own. The zero Chain has no backends, and its Do
// returns an [ErrConfig] error.
type Chain[Req, Resp any] struct {
	// Backends are tried in order. At least one is required.
	Backends []Backend[Req, Resp]
	// Classify decides the Kind of a backend's error. nil means the
	// package's [Classify]. It replaces that function whole; it is not
	// consulted for attempts ended by the caller's context or by the
	// backend's Timeout or StallTimeout.
	Classify func(error) Kind
	// OnAttempt, when set, is called with every attempt as it ends, success
	// (Err == nil) included, with Next, Why and RetryIn already decided and
	// before any wait. It runs on Do's goroutine, and its time is not
	// charged to any attempt; a wait that no longer fits once it returns is
	// not taken (the record in the returned error then says why). a.Err is
	// the backend's error as it was returned, secrets and all: print the
	// Attempt itself (its String, JSON and slog value are redacted) or
	// pass the text through [Redact].
	OnAttempt func(ctx context.Context, a Attempt)
	// MaxRawText is the most bytes of a model's raw output that an
	// attempt's record keeps: a broken server can send a gigabyte, and the
	// records go into errors, logs and dead-letter tables. Longer output is
	// cut at a character boundary and marked with " [llmretry: N bytes
	// cut]". 0 means DefaultMaxRawText; negative means no limit. The
	// backend's own Failure keeps its RawText whole.
	MaxRawText int
}

// DefaultMaxRawText is how many bytes of a model's raw output a record
// keeps when [Chain.MaxRawText] is zero.
const DefaultMaxRawText = 64 << 10

// configError is a configuration mistake: it wraps ErrConfig and advises
// against re-running the item.
type configError struct{ msg string }

func (e *configError) Error() string       { return e.msg }
func (e *configError) Unwrap() error       { return ErrConfig }
func (e *configError) ItemRetryable() bool { return false }

// Validate reports the first configuration mistake in the chain, or nil:
// no backends, a nil Call, a negative wait, Timeout or StallTimeout, a
// Jitter outside [0, 1], or Reserve, MaxWait or Jitter set while Waits is
// empty. The error names the backend by index and Model and wraps
// [ErrConfig]. Do runs the same checks before calling any backend.
func (c *Chain[Req, Resp]) Validate() error {
	if c == nil {
		return &configError{"llmretry: chain is nil"}
	}
	if len(c.Backends) == 0 {
		return &configError{"llmretry: chain has no backends"}
	}
	for i := range c.Backends {
		if err := c.Backends[i].validate(i); err != nil {
			return err
		}
	}
	return nil
}

// validate checks one backend; i is its index in the chain.
func (b *Backend[Req, Resp]) validate(i int) error {
	bad := func(what string) error {
		return &configError{"llmretry: backend " + strconv.Itoa(i) + " (" + modelName(b.Model) + "): " + what}
	}
	if b.Call == nil {
		return bad("call is nil")
	}
	if b.Timeout < 0 {
		return bad("timeout " + b.Timeout.String() + " is negative")
	}
	if b.StallTimeout < 0 {
		return bad("stall timeout " + b.StallTimeout.String() + " is negative")
	}
	if br := b.Breaker; br != nil && (br.Failures < 0 || br.Cooldown < 0) {
		return bad("breaker failures or cooldown is negative")
	}
	p := &b.Retry
	for j, w := range p.Waits {
		if w < 0 {
			return bad("wait " + strconv.Itoa(j+1) + " is negative")
		}
	}
	if math.IsNaN(p.Jitter) || p.Jitter < 0 || p.Jitter > 1 {
		return bad("jitter " + strconv.FormatFloat(p.Jitter, 'g', -1, 64) + " is outside [0, 1]")
	}
	// A policy with settings but no waits is almost always a forgotten
	// Waits list; treating it as "no retries" would hide the mistake.
	if len(p.Waits) == 0 {
		switch {
		case p.Reserve != 0:
			return bad("reserve is set but waits is empty")
		case p.MaxWait != 0:
			return bad("max wait is set but waits is empty")
		case p.Jitter != 0:
			return bad("jitter is set but waits is empty")
		}
	}
	return nil
}

// modelName is the name attempt records and messages use for a model.
func modelName(model string) string {
	if model == "" {
		return "unknown"
	}
	return model
}

// Do sends req through the chain and returns the first successful
// response. When every backend has failed it returns the typed error that
// [Exhaust] chooses ([*Truncated], [*TimedOut] or [*Exhausted]); when ctx
// is cancelled or an attempt fails with [KindCancelled], a [*Cancelled] at
// once. Each carries a record of every failed attempt, whose Next and Why
// say what the chain did after it. When ctx's deadline passes, Do stops
// and returns a [*TimedOut] (or [*Truncated], by precedence). A chain that
// is set up wrong returns the [ErrConfig] error of [Chain.Validate] before
// any backend is called.
//
// Do run by a backend of another chain that retries (a nested chain) makes
// one attempt per backend and never waits, so retries do not multiply;
// see [Standalone] for a chain that should retry on its own.
func (c *Chain[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	var zero Resp
	if err := c.Validate(); err != nil {
		return zero, err
	}
	if ctx == nil {
		return zero, &configError{"llmretry: context is nil"}
	}
	r := c.begin(ctx)
	defer r.leaveLine()
	for ; r.pos < r.planned(); r.pos++ {
		bi := r.backend()
		b := &c.Backends[bi]
		// A backend come back to goes on with its tries and its waits
		// where it left them: len(Waits) bounds its retries in the call.
		for try := r.sent(bi) + 1; ; try++ {
			if err := ctx.Err(); err != nil {
				r.halt(whyCtx(err))
				return zero, r.fail(err, context.Cause(ctx))
			}
			probe, ok := r.admit(b, bi, try)
			if !ok {
				break // skipped for its breaker, or stopped: the record says which
			}
			resp, a, end := r.attempt(b, bi, try, req, probe)
			if a.Err == nil {
				r.notify(a)
				return resp, nil
			}
			wait := r.decide(b, &a, end)
			r.record(a)
			if a.Next == NextStop {
				// The outcome is the state when the attempt ended, whatever
				// happened during OnAttempt.
				return zero, r.fail(end.ctxErr, end.cause)
			}
			if a.Next != NextRetry || !r.wait(b, wait) {
				break
			}
		}
		if r.attempts[len(r.attempts)-1].Next == NextStop {
			return zero, r.stopped()
		}
		r.failedOver(bi)
	}
	// Not reached: the last backend's last record always says stop.
	return zero, r.fail(ctx.Err(), context.Cause(ctx))
}

// run is the state of one Do.
type run[Req, Resp any] struct {
	c        *Chain[Req, Resp]
	ctx      context.Context
	parent   *attemptCtx   // the enclosing chain's attempt, nil when there is none
	nested   bool          // an enclosing attempt may be retried: make one attempt per backend
	reserve  time.Duration // what a zero Policy.Reserve means for this call
	attempts []Attempt     // every failed attempt so far
	start    time.Time     // when Do began: its place in a breaker's line

	// The plan: every backend in order, then once more the ones skipped
	// for their breakers, when every backend after them failed for a
	// reason about the request (otherwise a breaker would turn a primary's
	// recovery into the secondary's truncations).
	pos       int   // position in the plan
	revisit   []int // backends planned a second time
	deferred  []int // backends skipped for their breakers, not yet revisited, after which no backend failed for its health
	revisited bool  // the second pass has been planned

	line   *breakerWaiter // the call's place in a breaker's line, kept over a retry's wait
	lineOf *Breaker       // the breaker that line is for
}

// leaveLine gives up the call's place in a breaker's line, if it has one.
func (r *run[Req, Resp]) leaveLine() {
	if r.line != nil {
		r.lineOf.leave(r.line)
		r.line, r.lineOf = nil, nil
	}
}

// begin starts the state of one Do under ctx.
func (c *Chain[Req, Resp]) begin(ctx context.Context) run[Req, Resp] {
	r := run[Req, Resp]{c: c, ctx: ctx, reserve: DefaultReserve, start: time.Now()}
	// Only the outermost retrying request retries: an LM that wraps an LM
	// would otherwise turn k retries into (k+1)² requests.
	r.parent, _ = ctx.Value(markKey{}).(*attemptCtx)
	r.nested = r.parent != nil && r.parent.retrying
	// A 60s reserve under a 30s deadline would turn off every retry, even
	// the zero waits; half of what is left keeps room for both.
	if deadline, ok := ctx.Deadline(); ok {
		r.reserve = min(DefaultReserve, time.Until(deadline)/2)
	}
	return r
}

// planned is how many backends the plan holds so far.
func (r *run[Req, Resp]) planned() int { return len(r.c.Backends) + len(r.revisit) }

// backend is the index of the backend at the plan's position.
func (r *run[Req, Resp]) backend() int {
	if n := len(r.c.Backends); r.pos >= n {
		return r.revisit[r.pos-n]
	}
	return r.pos
}

// last reports whether the backend at the plan's position is the last
// the call can try, after an attempt of Kind k: a failure about the
// request sends the call back to the backends it skipped.
func (r *run[Req, Resp]) last(k Kind) bool {
	return r.pos == r.planned()-1 && !r.revisits(k)
}

// revisits reports whether a failure of Kind k at the end of the plan
// sends the call back to the backends it skipped.
func (r *run[Req, Resp]) revisits(k Kind) bool {
	return !r.revisited && len(r.deferred) > 0 && !aboutHealth(k)
}

// sent is how many requests the call has sent to backend bi so far.
func (r *run[Req, Resp]) sent(bi int) int {
	n := 0
	for i := range r.attempts {
		if r.attempts[i].Backend == bi && !r.attempts[i].Skipped {
			n++
		}
	}
	return n
}

// aboutHealth reports whether a failure of Kind k says the backend is
// unwell, rather than that it refused or fumbled this request.
func aboutHealth(k Kind) bool { return k == KindTransient || k == KindTimeout }

// failedOver moves the plan past backend bi, which the call gave up on.
func (r *run[Req, Resp]) failedOver(bi int) {
	switch a := &r.attempts[len(r.attempts)-1]; {
	case a.Why == WhyBreaker:
		// Skipped, or left because its breaker would still be open when
		// the retry's wait ended: come back to it. A retry put off so
		// failed for the backend's health, which rules out coming back to
		// those skipped before it.
		if !a.Skipped && aboutHealth(a.Kind) {
			r.deferred = nil
		}
		r.deferred = append(r.deferred, bi)
	case aboutHealth(a.Kind):
		// The outage is wider than the backends skipped so far: none of
		// them is worth coming back to. One skipped later still may be.
		r.deferred = nil
	}
	if r.pos == r.planned()-1 && len(r.deferred) > 0 {
		// The last record said fail_over: last() promised a second pass.
		r.revisit, r.deferred, r.revisited = r.deferred, nil, true
	}
}

// ended is the state of the world when an attempt's Call returned.
type ended struct {
	at     time.Time
	ctxErr error // the caller's context's Err, nil while it was live
	cause  error // context.Cause of the caller's context, or, for a withdrawal the backend reported, its error
	own    bool  // the backend's Timeout or StallTimeout ended the attempt
}

// attempt sends try number try to backend b and tells its breaker, if it
// has one, how it went (probe says whether it was the half-open probe),
// even when the backend's Call panics.
func (r *run[Req, Resp]) attempt(b *Backend[Req, Resp], bi, try int, req Req, probe bool) (Resp, Attempt, ended) {
	br := b.Breaker
	if br == nil {
		return r.send(b, bi, try, req)
	}
	finished := false
	defer func() {
		if !finished {
			// Nothing was learned, but a probe must not hold the breaker
			// half-open for good.
			br.observe(time.Now(), false, KindCancelled, 0, probe, 0)
		}
	}()
	resp, a, end := r.send(b, bi, try, req)
	finished = true
	switch {
	case end.ctxErr != nil:
		// The caller's own cancel or deadline ended it: that says
		// nothing about the backend's health.
		br.observe(end.at, false, KindCancelled, 0, probe, 0)
	default:
		br.observe(end.at, a.Err == nil, a.Kind, a.RetryAfter, probe, maxWait(&b.Retry))
	}
	return resp, a, end
}

// send makes one attempt of backend b and returns its response and
// record. For a failure, the record has its Kind and details; decide sets
// what follows.
func (r *run[Req, Resp]) send(b *Backend[Req, Resp], bi, try int, req Req) (Resp, Attempt, ended) {
	mark := &attemptCtx{Context: r.ctx, parent: r.parent, retrying: r.nested || len(b.Retry.Waits) > 0}
	start := time.Now()
	resp, err, own := b.callLimited(mark, req)
	elapsed := time.Since(start)
	end := ended{at: start.Add(elapsed), ctxErr: r.ctx.Err(), own: own}
	a := Attempt{
		Backend: bi, Model: modelName(b.Model), Try: try, Err: err,
		Start: start, Elapsed: elapsed, Delivered: mark.delivered.Load(),
	}
	if err == nil {
		return resp, a, end
	}
	kind, d := outcomeOf(err)
	a.Status, a.RawText, a.RetryAfter = d.status, capRaw(d.raw, r.c.MaxRawText), d.hint
	switch {
	case end.ctxErr != nil:
		// The caller's context ended the attempt, whatever the backend made
		// of it.
		a.Kind, end.cause = ctxKind(end.ctxErr), context.Cause(r.ctx)
	case own:
		// Our own timer ended it: a timeout, whatever error the backend
		// wrapped it in.
		a.Kind = KindTimeout
	case r.c.Classify == nil:
		a.Kind = kind // what Classify would say, without walking the tree twice
	default:
		a.Kind = r.c.Classify(err)
	}
	if a.Kind == KindCancelled && end.cause == nil {
		end.cause = err // the backend reported the withdrawal
	}
	return resp, a, end
}

// admit asks backend b's breaker whether try number try may be sent, and
// reports whether the attempt is the breaker's half-open probe. While the
// breaker is open it records a skipped attempt and reports false: the call
// fails over, or, when b is the last backend it can try, waits for the
// breaker for as long as a retry-after hint could hold it, and stops when
// that is not enough.
func (r *run[Req, Resp]) admit(b *Backend[Req, Resp], bi, try int) (probe, ok bool) {
	br := b.Breaker
	if br == nil {
		return false, true
	}
	w := r.line // kept over the wait before this retry, if any
	r.line, r.lineOf = nil, nil
	defer func() { br.leave(w) }()
	var limit time.Time // the longest this call may wait for the breaker
	for {
		now := time.Now()
		v := br.admit(now, w)
		if v.pass {
			return v.probe, true
		}
		if last := r.pos == r.planned()-1; !last || r.nested {
			// Fail over; a nested chain never waits: its skip's
			// RetryAfter becomes the enclosing attempt's hint.
			r.skip(b, bi, try, now, v, giveUp(WhyBreaker, last), WhyBreaker)
			return false, false
		}
		// The last backend the call can try: wait for it to half-open, or
		// for a probe in flight to end, for as long as a retry-after hint
		// could hold the call: MaxWait from now, and while the reserve
		// still fits before the deadline.
		if limit.IsZero() {
			limit = r.waitLimit(&b.Retry, now)
		}
		if deadline, ok := r.ctx.Deadline(); ok && !now.Before(deadline) {
			r.skip(b, bi, try, now, v, NextStop, WhyDeadline)
			return false, false
		}
		if !now.Before(limit) || (!v.until.IsZero() && (v.until.After(limit) || !r.fits(&b.Retry, v.until.Sub(now), now))) {
			r.skip(b, bi, try, now, v, NextStop, WhyBreaker)
			return false, false
		}
		if w == nil {
			w = br.join(r.start, now)
			continue // now in line, it may be this call's turn
		}
		wake := limit
		if !v.until.IsZero() {
			wake = v.until
		}
		if !sleepUntil(r.ctx, wake, v.changed) && time.Now().Before(limit) {
			// The caller's context ended the wait. (At the limit itself the
			// breaker decides, whichever timer fired first.)
			r.skip(b, bi, try, time.Now(), v, NextStop, whyCtx(r.ctx.Err()))
			return false, false
		}
	}
}

// waitLimit is the latest moment a call that began waiting for a breaker
// at now may still send its request: MaxWait later, and no later than
// the reserve allows; far off when neither bounds it. (A half-open time
// known in advance is checked as a retry's wait is, by fits.)
func (r *run[Req, Resp]) waitLimit(p *Policy, now time.Time) time.Time {
	limit := now.Add(maxOpen)
	if mw := maxWait(p); mw > 0 {
		limit = now.Add(mw)
	}
	if deadline, ok := r.ctx.Deadline(); ok {
		// A request sent at the limit must still leave the reserve, and
		// one sent at the deadline itself could not be answered.
		limit = minTime(limit, deadline.Add(-r.reserveOf(p)))
	}
	return limit
}

// minTime returns the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// skip records that try number try of backend b was not sent because its
// breaker was open (v), and what the call did instead.
func (r *run[Req, Resp]) skip(b *Backend[Req, Resp], bi, try int, now time.Time, v verdict, next Next, why Why) {
	a := Attempt{
		Backend: bi, Model: modelName(b.Model), Try: try, Kind: v.kind,
		Start: now, Skipped: true, Next: next, Why: why,
	}
	if !v.until.IsZero() {
		a.RetryAfter = max(v.until.Sub(now), 0) // when the backend takes work again, for RetryItemAfter
	}
	r.record(a)
}

// sleepUntil waits until t (forever when t is zero), or until changed is
// closed, and reports true; it returns false at once when ctx is done
// first.
func sleepUntil(ctx context.Context, t time.Time, changed <-chan struct{}) bool {
	var fire <-chan time.Time
	if !t.IsZero() {
		timer := time.NewTimer(time.Until(t))
		defer timer.Stop()
		fire = timer.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-changed:
	case <-fire:
	}
	return true
}

// capRaw returns raw, or a copy cut to at most max bytes (0: the default;
// negative: no limit) at a character boundary, with the cut marked.
func capRaw(raw *string, max int) *string {
	if max == 0 {
		max = DefaultMaxRawText
	}
	if raw == nil || max < 0 || len(*raw) <= max {
		return raw
	}
	n := max
	for n > 0 && !utf8.RuneStart((*raw)[n]) {
		n-- // do not split a character
	}
	cut := (*raw)[:n] + " [llmretry: " + strconv.Itoa(len(*raw)-n) + " bytes cut]"
	return &cut
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

// decide sets a failed attempt's Next and Why, and returns the wait before
// the retry when Next is NextRetry.
func (r *run[Req, Resp]) decide(b *Backend[Req, Resp], a *Attempt, end ended) time.Duration {
	var why Why
	switch {
	case a.Kind == KindCancelled:
		why = WhyCancelled
	case end.ctxErr != nil:
		why = WhyDeadline
	case a.Delivered:
		// The caller already holds part of this answer: resending would
		// duplicate it, and so would another backend.
		why = WhyDelivered
	case !a.Kind.Retryable():
		why = WhyNotRetryable
	case r.nested:
		why = WhyNested
	default:
		var w time.Duration
		w, why = r.nextWait(b, a.Try, a.RetryAfter, end.at)
		if why == "" && !r.last(a.Kind) && b.Breaker.openPast(end.at.Add(w)) {
			// The breaker will still be open when the wait ends: the retry
			// would only skip, so fail over now rather than after the wait.
			why = WhyBreaker
		}
		if why == "" {
			a.Next, a.RetryIn = NextRetry, w
			return w
		}
	}
	a.Next, a.Why = giveUp(why, r.last(a.Kind)), why
	return 0
}

// giveUp is what follows an attempt that is not retried for reason why.
func giveUp(why Why, last bool) Next {
	switch {
	case last, why == WhyCancelled, why == WhyDeadline, why == WhyDelivered:
		return NextStop
	}
	return NextFailOver
}

// nextWait returns the wait before the retry that follows failed try
// number try, decided at now, or why there is none. hint is the server's
// retry-after.
func (r *run[Req, Resp]) nextWait(b *Backend[Req, Resp], try int, hint time.Duration, now time.Time) (time.Duration, Why) {
	p := &b.Retry
	_, hasDeadline := r.ctx.Deadline()
	n := len(p.Waits)
	var w time.Duration
	switch {
	case try <= n:
		w = jitter(p.Waits[try-1], p.Jitter)
	case hasDeadline && n > 0 && p.Waits[n-1] > 0:
		// The last wait repeats, bounded by the deadline. A zero last wait
		// does not: repeated, it would be a request storm until the
		// deadline, hammering a paid API that is already failing.
		w = max(jitter(p.Waits[n-1], p.Jitter), minRepeat)
	default:
		return 0, WhyWaitsUsed // without a deadline the list is the bound, so a call can't wait forever
	}
	if hint > 0 {
		// A hostile or broken server must not park a caller for a day.
		if mw := maxWait(p); mw > 0 && hint > mw {
			return 0, WhyMaxWait
		}
		w = max(w, hint)
		if b.Breaker != nil {
			// The hint opened the breaker for everyone: come back when it
			// half-opens, like everyone else, rather than later, to find
			// the capacity taken.
			w = hint
		}
	}
	if !r.fits(p, w, now) {
		return 0, WhyReserve
	}
	return w, ""
}

// maxWait is the longest retry-after hint p honours; non-positive means
// no cap.
func maxWait(p *Policy) time.Duration {
	if p.MaxWait == 0 {
		return DefaultMaxWait
	}
	return p.MaxWait
}

// jitter draws a wait from [w*(1-j), w].
func jitter(w time.Duration, j float64) time.Duration {
	if j > 0 && w > 0 {
		w -= time.Duration(j * rand.Float64() * float64(w))
	}
	return w
}

// fits reports whether a wait of w that starts now ends before the
// caller's deadline with the reserve still left. Checked before sleeping: a
// wait that leaves no time to use it only turns a backend's error into a
// deadline error.
func (r *run[Req, Resp]) fits(p *Policy, w time.Duration, now time.Time) bool {
	deadline, ok := r.ctx.Deadline()
	if !ok {
		return true
	}
	left := deadline.Sub(now)
	return w < left && left-w >= r.reserveOf(p)
}

// reserveOf is the time p's backend must leave before the deadline.
func (r *run[Req, Resp]) reserveOf(p *Policy) time.Duration {
	switch {
	case p.Reserve == 0:
		return r.reserve
	case p.Reserve < 0:
		return 0
	}
	return p.Reserve
}

// wait sleeps for w before a retry of backend b and reports true, or
// corrects the last record and reports false when the retry is off: the
// wait no longer fits after OnAttempt (decided and started from one clock
// reading), or the caller's context ended first.
func (r *run[Req, Resp]) wait(b *Backend[Req, Resp], w time.Duration) bool {
	if err := r.ctx.Err(); err != nil {
		r.halt(whyCtx(err))
		return false
	}
	now := time.Now()
	if !r.fits(&b.Retry, w, now) {
		a := &r.attempts[len(r.attempts)-1]
		a.Next, a.Why, a.RetryIn = giveUp(WhyReserve, r.last(a.Kind)), WhyReserve, 0
		return false
	}
	if b.Breaker != nil {
		// In the breaker's line from now, to come to it when the wait
		// ends: a call coming back after a retry-after goes before those
		// that began later.
		r.line, r.lineOf = b.Breaker.join(r.start, now.Add(w)), b.Breaker
	}
	if w == 0 {
		return true // no timer for a zero wait
	}
	t := time.NewTimer(w)
	defer t.Stop()
	select {
	case <-r.ctx.Done():
		r.halt(whyCtx(r.ctx.Err()))
		r.leaveLine()
		return false
	case <-t.C:
		return true
	}
}

// record keeps a failed attempt and hands it to OnAttempt.
func (r *run[Req, Resp]) record(a Attempt) {
	r.attempts = append(r.attempts, a)
	r.notify(a)
}

// notify hands an attempt to OnAttempt.
func (r *run[Req, Resp]) notify(a Attempt) {
	if r.c.OnAttempt != nil {
		r.c.OnAttempt(r.ctx, a)
	}
}

// stopped is the error of a call whose last record says stop, after a
// skip or a wait rather than an attempt: the record's reason decides it.
func (r *run[Req, Resp]) stopped() error {
	switch r.attempts[len(r.attempts)-1].Why {
	case WhyCancelled:
		return r.fail(r.ctx.Err(), context.Cause(r.ctx))
	case WhyDeadline:
		// Decided at the deadline, perhaps before the context's own timer
		// has fired.
		return r.fail(context.DeadlineExceeded, context.Cause(r.ctx))
	}
	// Stopped for a reason of the chain's own: that decides the outcome,
	// whatever the context did meanwhile.
	return r.fail(nil, nil)
}

// halt marks the last record as the one after which Do stopped, for why,
// so that the records in an error say what actually happened, even when
// OnAttempt was told otherwise.
func (r *run[Req, Resp]) halt(why Why) {
	if n := len(r.attempts); n > 0 && r.attempts[n-1].Next != NextStop {
		a := &r.attempts[n-1]
		a.Next, a.Why, a.RetryIn = NextStop, why, 0
	}
}

// fail is the error of a call that has stopped. ctxErr and cause are the
// caller's context's Err and Cause when it stopped (nil while it was live;
// for a withdrawal that the backend reported, context.Canceled and the
// backend's error). The records decide, as they do for [Exhaust]: the
// caller's cancellation wins over the attempts' own failures, and a
// deadline that ran out makes it a TimedOut (or Truncated).
func (r *run[Req, Resp]) fail(ctxErr, cause error) error {
	return conclude(r.attempts, ctxErr, cause)
}

// ctxKind is the Kind of an attempt ended by a done context.
func ctxKind(ctxErr error) Kind {
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		return KindTimeout
	}
	return KindCancelled
}

// whyCtx is the reason a done context gives for stopping.
func whyCtx(ctxErr error) Why {
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		return WhyDeadline
	}
	return WhyCancelled
}

// markKey finds the innermost attempt mark in a context.
type markKey struct{}

// attemptCtx is the context a backend's Call receives: the caller's
// context (or the attempt's own, under a Timeout or StallTimeout) plus the
// attempt's mark. The context package still finds the parent's
// cancellation through Value, so no goroutine is started to propagate it.
type attemptCtx struct {
	context.Context
	parent    *attemptCtx // the enclosing chain's attempt, for nested chains
	retrying  bool        // this attempt or one enclosing it may be retried: nested chains must not retry
	delivered atomic.Bool // output has reached the caller: never resend
	stall     *stallTimer // ends the attempt when no output comes; nil without a StallTimeout
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
// to call from any goroutine, and as often as needed.
func Delivered(ctx context.Context) {
	if ctx == nil {
		return
	}
	a, _ := ctx.Value(markKey{}).(*attemptCtx)
	for ; a != nil; a = a.parent {
		a.delivered.Store(true)
		if a.stall != nil {
			a.stall.touch()
		}
	}
}

// Standalone returns a context under which a Chain runs on its own: it
// retries by its own policies even inside another chain's attempt, and
// its [Delivered] calls do not mark the enclosing attempt. Use it for an
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
	if _, ok := key.(markKey); ok {
		return nil
	}
	return s.Context.Value(key)
}
