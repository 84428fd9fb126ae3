package llmretry

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"
)

// DefaultReserve is the time a wait must leave before the caller's
// deadline when [Policy.Reserve] is zero: enough for one more request to
// a slow model to finish.
const DefaultReserve = 60 * time.Second

// DefaultMaxWait is the longest retry-after hint a backend honours when
// [Policy.MaxWait] is zero. A longer hint ends the backend's retries.
const DefaultMaxWait = 5 * time.Minute

// ErrConfig is wrapped by every error that [Chain.Validate] and
// [Chain.Do] return for a chain that is set up wrong. Match it with
// errors.Is. Such errors advise [RetryItem] false: re-running an item
// against a broken chain fails the same way.
var ErrConfig = errors.New("llmretry: invalid configuration")

// Policy says when one backend is tried again after a retryable failure.
// The zero Policy makes one attempt and no retries.
type Policy struct {
	// Waits are the waits before the 1st, 2nd, ... retry in this backend.
	// Without a deadline on the context, len(Waits) bounds the retries;
	// with one, the last wait repeats while Reserve still fits, unless it
	// is zero. Empty means no retries, and then the other fields must be
	// zero.
	Waits []time.Duration
	// Reserve is the time that must remain before the context's deadline
	// after a wait, or the wait is not taken and the backend gives up.
	// 0 means DefaultReserve; negative means none, though a wait must still
	// end before the deadline.
	Reserve time.Duration
	// MaxWait caps a server's retry-after hint: a longer hint ends this
	// backend's retries instead of parking the caller. 0 means
	// DefaultMaxWait; negative means no cap.
	MaxWait time.Duration
	// Jitter spreads the waits: each wait w is drawn from
	// [w*(1-Jitter), w]. It must lie in [0, 1]; 0 means exact waits.
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
	Call func(ctx context.Context, req Req) (Resp, error)
	// Retry is the retry policy within this backend. The zero value makes
	// one attempt, no retries.
	Retry Policy
	// Timeout is each attempt's response deadline; an attempt that hits it
	// is [KindTimeout], retried as the policy allows. 0 means none.
	Timeout time.Duration
}

// Chain runs its backends in order: it retries within a backend after
// timed waits and falls over to the next backend when one gives up. A
// Chain is immutable once built and safe for concurrent Do calls; each
// call's state stays on its own stack. The zero Chain has no backends, and
// its Do returns an [ErrConfig] error.
type Chain[Req, Resp any] struct {
	// Backends are tried in order. At least one is required.
	Backends []Backend[Req, Resp]
	// Classify decides the Kind of a backend's error. nil means the
	// package's [Classify]. It replaces that function whole; it is not
	// consulted for attempts ended by the caller's context or by the
	// backend's Timeout.
	Classify func(error) Kind
	// OnAttempt, when set, is called with every attempt as it ends, success
	// (Err == nil) included, before any wait and with RetryIn already set.
	// It runs on Do's goroutine: keep it quick.
	OnAttempt func(ctx context.Context, a Attempt)
}

// configError is a configuration mistake: it wraps ErrConfig and advises
// against re-running the item.
type configError struct{ msg string }

func (e *configError) Error() string       { return e.msg }
func (e *configError) Unwrap() error       { return ErrConfig }
func (e *configError) ItemRetryable() bool { return false }

// Validate reports the first configuration mistake in the chain, or nil:
// no backends, a nil Call, a negative wait or Timeout, a Jitter outside
// [0, 1], or Reserve, MaxWait or Jitter set while Waits is empty. The
// error names the backend by index and Model and wraps [ErrConfig]. Do
// runs the same checks before calling any backend.
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

// callWithTimeout makes one attempt under mark and the backend's Timeout,
// and reports whether that Timeout ended it. The timer is stopped in a
// defer, so a panicking Call cannot leave it running.
func (b *Backend[Req, Resp]) callWithTimeout(ctx context.Context, mark *attemptCtx, req Req) (Resp, bool, error) {
	tctx, cancel := context.WithTimeoutCause(ctx, b.Timeout, errAttemptTimeout)
	defer cancel()
	mark.Context = tctx
	resp, err := b.Call(mark, req)
	return resp, context.Cause(tctx) == errAttemptTimeout, err
}

// errAttemptTimeout is the cause of a context ended by Backend.Timeout, so
// that it can be told apart from the caller's own deadline.
var errAttemptTimeout = errors.New("llmretry: attempt timeout")

// Do sends req through the chain and returns the first successful
// response. When every backend has failed it returns the typed error that
// [Exhaust] chooses ([*Truncated], [*TimedOut] or [*Exhausted]); when ctx
// is cancelled or an attempt fails with [KindCancelled], a [*Cancelled] at
// once. Each carries a record of every failed attempt. When ctx's deadline
// passes, Do stops and returns a [*TimedOut] (or [*Truncated], by
// precedence). A chain that is set up wrong returns the [ErrConfig] error
// of [Chain.Validate] before any backend is called.
//
// Do run by a backend of another chain that retries (a nested chain) makes
// one attempt per backend and never waits, so retries do not multiply.
func (c *Chain[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	var zero Resp
	if err := c.Validate(); err != nil {
		return zero, err
	}
	if ctx == nil {
		return zero, &configError{"llmretry: context is nil"}
	}
	classify := c.Classify
	if classify == nil {
		classify = Classify
	}
	// Only the outermost retrying request retries: an LM that wraps an LM
	// would otherwise turn k retries into (k+1)² requests.
	parent, _ := ctx.Value(markKey{}).(*attemptCtx)
	nested := parent != nil && parent.retrying

	var (
		clock    callClock
		startOff = clock.now() // when the next attempt starts; the monotonic clock alone (#3)
		rec      records
		spare    []attemptCtx // marks for retries, allocated in batches rather than one per attempt (#3)
		timer    *time.Timer  // one per call, reset for every wait (#3)
	)
	for bi := range c.Backends {
		b := &c.Backends[bi]
		retrying := !nested && len(b.Retry.Waits) > 0
		for try := 1; ; try++ {
			if ctx.Err() != nil {
				return zero, fail(ctx, rec.all())
			}
			var mark *attemptCtx
			switch {
			case rec.n == 0:
				mark = new(attemptCtx) // the first attempt: the success path's one allocation
			case len(spare) == 0:
				spare = make([]attemptCtx, c.remaining(bi, try, retrying))
				fallthrough
			default:
				mark, spare = &spare[0], spare[1:]
			}
			mark.Context, mark.parent, mark.retrying = ctx, parent, retrying || nested
			var (
				resp            Resp
				err             error
				attemptTimedOut bool
			)
			if b.Timeout > 0 {
				resp, attemptTimedOut, err = b.callWithTimeout(ctx, mark, req)
			} else {
				resp, err = b.Call(mark, req)
			}
			if err == nil {
				if c.OnAttempt != nil {
					start, endOff := clock.ended(startOff)
					c.OnAttempt(ctx, Attempt{
						Backend: bi, Model: modelName(b.Model), Try: try,
						Start: start, Elapsed: endOff - startOff, Delivered: mark.delivered.Load(),
					})
				}
				return resp, nil
			}

			start, endOff := clock.ended(startOff)
			a := Attempt{
				Backend: bi, Model: modelName(b.Model), Try: try, Err: err,
				Start: start, Elapsed: endOff - startOff, Delivered: mark.delivered.Load(),
			}
			var hint time.Duration
			a.Status, a.RawText, hint = details(err)
			switch {
			case ctx.Err() != nil:
				// The caller's context ended the attempt, whatever the
				// backend made of it.
				a.Kind = ctxKind(ctx)
			case attemptTimedOut:
				// Our own per-attempt timer ended it: a timeout, whatever
				// error the backend wrapped it in.
				a.Kind = KindTimeout
			default:
				a.Kind = classify(err)
			}

			if a.Kind == KindCancelled {
				c.record(ctx, &rec, &a, 0)
				cause := err
				if ctx.Err() != nil {
					cause = context.Cause(ctx)
				}
				return zero, &Cancelled{Attempts: rec.all(), Cause: cause}
			}
			if a.Delivered {
				// The caller already holds part of this answer: resending
				// would duplicate it, and so would another backend.
				c.record(ctx, &rec, &a, 0)
				return zero, fail(ctx, rec.all())
			}
			wait, again := time.Duration(0), false
			if retrying && a.Kind.Retryable() && ctx.Err() == nil {
				wait, again = nextWait(ctx, &b.Retry, try, hint)
			}
			if again {
				a.RetryIn = wait
			}
			c.record(ctx, &rec, &a, c.planned(bi, try+1, again))
			// Without a wait the next attempt starts now; the few
			// nanoseconds of bookkeeping since endOff are not worth a
			// clock read.
			startOff = endOff
			if !again {
				break // fall over to the next backend
			}
			if wait > 0 {
				if !sleep(ctx, &timer, wait) {
					return zero, fail(ctx, rec.all())
				}
				startOff = clock.now()
			}
		}
	}
	return zero, fail(ctx, rec.all())
}

// epoch is the origin of the offsets that Do reads. They are monotonic
// readings, except inside a testing/synctest bubble, where time carries no
// monotonic reading and they are exact differences on the bubble's fake
// wall clock (about -26 years, far inside a Duration's range).
var epoch = time.Now()

// callClock tells when a call's attempts started. A successful first
// attempt needs no time of day, and reading the wall clock costs nearly twice what
// the monotonic clock does and more than the rest of a successful Do (#3).
// So Do reads only the monotonic clock, as offsets from epoch, until an
// attempt is reported; then it reads the wall clock once and places every
// Start by its monotonic offset from that reading.
type callClock struct {
	wall    time.Time     // the call's one wall-clock reading; zero until an attempt is reported
	wallOff time.Duration // wall as an offset from epoch
}

// now returns the time as an offset from epoch, for the start of an
// attempt.
func (c *callClock) now() time.Duration {
	return time.Since(epoch)
}

// ended returns, for an attempt that started at offset startOff and has
// just ended, its Start and the offset at which it ended. The call's first
// ended reads the wall clock.
func (c *callClock) ended(startOff time.Duration) (start time.Time, endOff time.Duration) {
	if c.wall.IsZero() {
		c.wall = time.Now()
		c.wallOff = c.wall.Sub(epoch)
		endOff = c.wallOff
	} else {
		endOff = time.Since(epoch)
	}
	return c.wall.Add(startOff - c.wallOff), endOff
}

// record keeps a failed attempt and reports it to OnAttempt. more guesses
// how many attempts may follow it.
func (c *Chain[Req, Resp]) record(ctx context.Context, rec *records, a *Attempt, more int) {
	rec.add(a, more)
	if c.OnAttempt != nil {
		c.OnAttempt(ctx, *a)
	}
}

// fail is the error of a chain that has given up, or whose caller's
// context is done: the caller's cancellation wins over the attempts' own
// failures, and a deadline that ran out makes it a TimedOut (or Truncated).
func fail(ctx context.Context, attempts []Attempt) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return &Cancelled{Attempts: attempts, Cause: context.Cause(ctx)}
	}
	return exhaust(attempts, ctx.Err() != nil)
}

// remaining guesses how many attempts a call may still make from try number
// try of backend bi: the rest of that backend's listed tries when it is
// being retried, and one try for each backend after it. It sizes
// allocations, so it is capped: a long policy should not cost memory up
// front for failures that rarely all happen.
func (c *Chain[Req, Resp]) remaining(bi, try int, retried bool) int {
	n := len(c.Backends) - bi - 1
	if retried {
		n += max(len(c.Backends[bi].Retry.Waits)+2-try, 1)
	}
	return min(max(n, 1), 16)
}

// planned is how many attempts the policies allow from try number try of
// backend bi, without a deadline: the rest of that backend's tries when it
// is being retried, and every try of the backends after it. It sizes the
// records once a call has failed often enough to spill them to the heap,
// when a failing outage is the likely story. It is capped like remaining.
func (c *Chain[Req, Resp]) planned(bi, try int, retried bool) int {
	n := 0
	if retried {
		n = max(len(c.Backends[bi].Retry.Waits)+2-try, 1)
	}
	for i := bi + 1; i < len(c.Backends) && n < 32; i++ {
		n += len(c.Backends[i].Retry.Waits) + 1
	}
	return min(n, 32)
}

// records holds a call's failed attempts. The first few stay in an array
// in the struct, on Do's stack, and are copied to the heap only when an
// error needs them, so a call that fails a few times and then succeeds, or
// one parked in a wait, keeps no record on the heap (#3). The array is
// never sliced into a slice that escapes, or escape analysis would move it
// to the heap for every call.
type records struct {
	n     int
	first [inlineRecords]Attempt
	list  []Attempt // every record, once there are more than fit in first
}

// inlineRecords is how many records a call keeps before it allocates: enough
// for the common outage of a few failures followed by a success.
const inlineRecords = 4

// add appends a; more guesses how many records may follow, so that a
// spilled list is allocated once with room for them.
func (r *records) add(a *Attempt, more int) {
	switch {
	case r.n < inlineRecords:
		r.first[r.n] = *a
	case r.n == inlineRecords:
		r.list = make([]Attempt, inlineRecords, inlineRecords+1+more)
		copy(r.list, r.first[:])
		r.list = append(r.list, *a)
	default:
		r.list = append(r.list, *a)
	}
	r.n++
}

// all returns the records in order, on the heap; nil when there are none.
func (r *records) all() []Attempt {
	switch {
	case r.n == 0:
		return nil
	case r.n <= inlineRecords:
		return append([]Attempt(nil), r.first[:r.n]...)
	}
	return r.list
}

// ctxKind is the Kind of an attempt ended by a done context.
func ctxKind(ctx context.Context) Kind {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return KindTimeout
	}
	return KindCancelled
}

// details extracts what a backend's error says beyond its Kind: the HTTP
// status, the model's raw output and the server's retry-after hint. A
// nested chain's error answers with its last attempt.
func details(err error) (status int, raw *string, hint time.Duration) {
	// A bare *Failure is the common case; skip the walks below (#3).
	if f, ok := err.(*Failure); ok && f != nil && f.Err == nil {
		return f.Status, f.RawText, f.RetryAfter
	}
	var last *Attempt
	if e, ok := asType[*Exhausted](err); ok {
		if n := len(e.Attempts); n > 0 {
			last = &e.Attempts[n-1]
		}
	} else if e, ok := asType[*Cancelled](err); ok {
		if n := len(e.Attempts); n > 0 {
			last = &e.Attempts[n-1]
		}
	}
	if last != nil {
		_, _, hint = details(last.Err)
		return last.Status, last.RawText, hint
	}
	if f, ok := asType[*Failure](err); ok && f != nil {
		return f.Status, f.RawText, f.RetryAfter
	}
	return 0, nil, 0
}

// nextWait returns the wait before the retry that follows failed try
// number try, and false when this backend should not be tried again.
func nextWait(ctx context.Context, p *Policy, try int, hint time.Duration) (time.Duration, bool) {
	deadline, hasDeadline := ctx.Deadline()
	var w time.Duration
	switch {
	case try <= len(p.Waits):
		w = p.Waits[try-1]
	case hasDeadline && p.Waits[len(p.Waits)-1] > 0:
		// The last wait repeats, bounded by the deadline. A zero last wait
		// does not: repeated, it would be a request storm until the
		// deadline, hammering a paid API that is already failing.
		w = p.Waits[len(p.Waits)-1]
	default:
		return 0, false // without a deadline the list is the bound, so a call can't wait forever
	}
	if p.Jitter > 0 && w > 0 {
		w -= time.Duration(p.Jitter * rand.Float64() * float64(w))
	}
	if hint > 0 {
		maxWait := p.MaxWait
		if maxWait == 0 {
			maxWait = DefaultMaxWait
		}
		// A hostile or broken server must not park a caller for a day.
		if maxWait > 0 && hint > maxWait {
			return 0, false
		}
		w = max(w, hint)
	}
	if hasDeadline {
		reserve := p.Reserve
		if reserve == 0 {
			reserve = DefaultReserve
		}
		// Check before sleeping: a wait that leaves no time to use it only
		// turns a backend's error into a deadline error.
		left := time.Until(deadline)
		if w >= left || left-w < reserve {
			return 0, false
		}
	}
	return w, true
}

// sleep waits for d and reports true, or returns false at once when ctx is
// done first. It reuses *t across the waits of one call, creating it on the
// first. A timer that fired needs no Stop, and one whose wait was cut short
// is stopped here, so none outlives Do.
func sleep(ctx context.Context, t **time.Timer, d time.Duration) bool {
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	select {
	case <-ctx.Done():
		(*t).Stop()
		return false
	case <-(*t).C:
		return true
	}
}

// markKey finds the innermost attempt mark in a context.
type markKey struct{}

// attemptCtx is the context a backend's Call receives: the caller's
// context plus the attempt's mark. Being a context itself, rather than a
// value stored with context.WithValue, it costs one allocation per attempt
// (#3). The context package still finds the parent's cancellation through
// Value, so no goroutine is started to propagate it.
type attemptCtx struct {
	context.Context
	parent    *attemptCtx // the enclosing chain's attempt, for nested chains
	retrying  bool        // this attempt or one enclosing it may be retried: nested chains must not retry
	delivered atomic.Bool // output has reached the caller: never resend
}

// Value returns the attempt itself for markKey and asks the parent
// otherwise.
func (a *attemptCtx) Value(key any) any {
	if _, ok := key.(markKey); ok {
		return a
	}
	return a.Context.Value(key)
}

// Delivered tells the chain that the attempt running under ctx has handed
// output to the caller, such as a streamed chunk. From then on a failure
// of that attempt is returned at once: it is not sent again and no other
// backend is tried, because the caller already holds part of an answer. In
// nested chains it marks every enclosing chain's attempt too. With a
// context that is not an attempt's, Delivered does nothing. It is safe to
// call from any goroutine, and more than once.
func Delivered(ctx context.Context) {
	if ctx == nil {
		return
	}
	a, _ := ctx.Value(markKey{}).(*attemptCtx)
	for ; a != nil; a = a.parent {
		a.delivered.Store(true)
	}
}
