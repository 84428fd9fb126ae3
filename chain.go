package llmretry

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
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
// against a broken chain fails the same way. ErrConfig carries that
// advice itself, so any error that wraps it (fmt.Errorf with %w, from any
// package) advises false too, unless an error above it in the tree says
// otherwise.
var ErrConfig error = errConfig{}

// errConfig is ErrConfig's type: a comparable value, so errors.Is finds
// ErrConfig by ==, with the advice on it.
type errConfig struct{}

func (errConfig) Error() string       { return "llmretry: invalid configuration" }
func (errConfig) ItemRetryable() bool { return false }

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
	// Empty means no retries, and then the other fields must be zero,
	// FailOverSilent excepted.
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
	// MaxTries caps the requests sent to this backend in one call, the
	// first included: a call that has sent MaxTries gives up on it with
	// Why [WhyWaitsUsed], even while the last wait would still repeat
	// under a deadline. 0 means no cap beyond the other rules; negative
	// is a configuration error.
	MaxTries int
	// FailOverSilent makes an attempt that timed out before any output
	// (no [Delivered] or [Progress] call: a provider that took the request
	// and never answered, or whose first token came later than the
	// backend's StallTimeout) fail over to the next backend at once, with
	// Why [WhySilent], instead of being retried: a silent backend costs
	// the call one try, not its waits and MaxTries. On the last backend
	// the call can try it changes nothing, and that backend is retried as
	// the other fields say. Bound the time to first output with
	// [Backend.StallTimeout], which counts from the attempt's start to its
	// first output. A plain (not streaming) request has no output before
	// its answer, so with it set every timed-out attempt fails over. It
	// needs no Waits: without them a timed-out attempt fails over anyway,
	// and its record then says why it was silent.
	FailOverSilent bool
}

// Backend is one model in a [Chain]: how to call it and how hard to retry
// it.
type Backend[Req, Resp any] struct {
	// Model names the backend in attempt records and messages. Empty is
	// recorded as "unknown".
	Model string
	// Provider names who serves Model, as the OpenTelemetry GenAI
	// semantic conventions spell gen_ai.provider.name: "openai",
	// "anthropic", "gcp.gemini", "azure.ai.openai", ... The adapters under
	// contrib/ set it; the chain does not read it, it is for telemetry
	// (contrib/otelretry). Empty means unknown.
	Provider string
	// Stream says that Call asks the provider for a streamed answer, for
	// telemetry (gen_ai.request.stream); the streaming adapters set it.
	// The chain does not read it.
	Stream bool
	// Estimate, when set, says what a request will use before it is sent:
	// its input tokens as estimated from the request, and its output
	// budget (the request's max tokens). The backend's Breaker then counts
	// it against the provider's token buckets from the moment the request
	// is let through until the provider's next report says what was used,
	// so that a burst of large requests does not overshoot a
	// tokens-per-minute limit before the first report comes back. The
	// adapters set it. nil means not known: the Breaker learns a request's
	// use from the reports.
	Estimate func(req Req) Usage
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
	// [KindTimeout], retried as the policy allows. 0 means none. Retries
	// cost money as well as time: a timed-out attempt may have been
	// finished and billed by the provider with nothing recorded, so its
	// retry can be billed twice.
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
	// CanContinue, when set, reports whether the backend can go on with
	// an answer from c, what the caller already holds of it
	// ([Chain.Continue]); nil means it cannot. It is asked before each
	// request the chain would send to continue an answer, and its Call
	// then reads c with [Continuing]. A backend that learns it cannot,
	// such as a model that refuses an assistant prefill, fails that
	// attempt with [ErrCannotContinue] and says no from then on. The
	// adapters under contrib/ set it for the backends that can continue.
	CanContinue func(c Continuation) bool
	// Breaker, when set, is the backend's health shared across calls: while
	// it is open, calls skip the backend instead of spending their own
	// retries on it, and a retry-after hint is the wait itself rather than
	// a floor under the policy's wait, so the caller that got it comes back
	// when the breaker half-opens, with everyone else. Share one pointer
	// among every chain that calls the same deployment. nil means none.
	// [Breaker] has the rules of its states.
	//
	// A call that skipped the backend comes back to it when every backend
	// after it failed for a reason about the request (truncated, rejected,
	// parse, unknown); a backend skipped too does not count against it. A
	// backend whose retry was put off, because its breaker would still be
	// open when the wait ended, is come back to in the same way; when it
	// failed for the backend's health, it rules out coming back to those
	// skipped before it. The backends to come back to are chosen once, when
	// the call has been through the whole chain, and are tried in chain
	// order, each once, going on with their tries and waits where they left
	// them.
	//
	// A call waits for the breaker only when the backend is the last it
	// can try, and never longer than it would have spent retrying the
	// backend without one: its time on the backend, from when it first came
	// to it (sent or skipped; time spent on other backends since counts
	// too, so a backend come back to late is seldom waited for) to the end
	// of the wait, stays within the waits of Retry (a last wait that repeats under a deadline counts as
	// often as MaxTries allows, and once without it: an open breaker is the
	// backend saying it is down, and the repeats are for a backend that may
	// answer at any moment), no further than MaxWait from when it began to
	// wait, and ending with the reserve still left before the deadline. A
	// breaker that a retry-after hint opened is the exception: the provider
	// said when it would be back, so the call may wait it out within
	// MaxWait and the reserve. When the breaker will not half-open within
	// the bound, the call does not wait: it stops, with Why [WhyBreaker].
	Breaker *Breaker
	// Pool, when set, makes the backend a pool of deployments of one
	// model, and then Call and Breaker must be nil: each deployment has
	// its own (see [Deployment]). Each request goes to the deployment that
	// can take it soonest: of the lowest Tier that has one its Breaker
	// lets through now, the one with the most headroom by its provider's
	// freshest rate-limit report (requests and tokens), then the fewest
	// requests in flight for its Weight, then the first in the pool's
	// order, so that runs are reproducible. A failure about the
	// deployment's health or its limits ([KindTransient], [KindTimeout])
	// sends the request to the next-best deployment at once, before the
	// policy's next wait and before the chain's next backend; a failure
	// about the request (a rejection, a truncation, a refusal, a parse
	// failure) is decided as for any backend: another deployment would
	// answer it the same way. When every deployment has failed the request
	// in turn, Retry decides as for any backend, each of its retries again
	// going to the best deployment. With a Store, the choice reads each
	// Breaker as this process last saw the fleet's state; when the chosen
	// deployment's Breaker, asked, holds the request back after all, the
	// request goes on at once to the next-best deployment (the skip's
	// record says retry, at once) rather than wait for it while another
	// of its tier is left to try. When no deployment can take the request
	// now, the pool is skipped like a backend whose breaker is open, or,
	// when it is the last backend the call can try, the request waits for
	// the deployment that may take it soonest: the one whose Breaker holds
	// it back the shortest time, counting a pace of its provider's for
	// each call already waiting in its line, then the one with the fewest
	// calls waiting for its Weight, then the first in order. Should that
	// one not be waited for (it would not half-open within the bound that
	// [Backend.Breaker] states), or its wait end in vain, the next soonest
	// is, within the same bound: MaxWait counts from the first deployment
	// waited for, as on one backend. Every record of a
	// pool's requests, skips and waits names its deployment
	// ([Attempt.Deployment]) and why it was chosen ([Attempt.Chosen]).
	Pool []Deployment[Req, Resp]
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
	// before any wait; Do then carries out that decision. It runs on Do's
	// goroutine, and its time is not charged to any attempt, but a wait is
	// measured from the attempt's end, so a slow OnAttempt shortens it. The
	// one exception: when the caller's own cancel or deadline cuts a wait
	// (or the OnAttempt before it) short, Do stops, and the record in the
	// returned error says stop and why while OnAttempt heard retry or fail
	// over. A skip of a call that waited for a breaker is handed over when
	// the wait ends (see [Attempt.Skipped]). a.Err is
	// the backend's error as it was returned, secrets and all: print the
	// Attempt itself (its String, JSON and slog value are redacted) or
	// pass the text through [Redact].
	OnAttempt func(ctx context.Context, a Attempt)
	// OnAttemptStart, when set, is called before each request is sent,
	// on Do's goroutine, with the call's context (the one OnAttempt
	// gets), the backend's index, its Model as the record names it, and
	// the request's Try. The context it returns is the one the backend's
	// Call runs under, beneath the attempt's own mark, Timeout and
	// StallTimeout: it must be ctx or derived from it with values added,
	// such as a tracing span for the Call's HTTP client to find, since a
	// context cut off from ctx would lose the caller's cancellation. nil
	// means ctx. A skip sends nothing and has no start; every start is
	// followed by its attempt's OnAttempt, unless the Call panics. Its
	// time is not charged to the attempt.
	OnAttemptStart func(ctx context.Context, backend int, model string, try int) context.Context
	// WrapDo, when set, runs each Do: Do hands it the caller's context
	// and a function that does the call's work, and returns what WrapDo
	// returns. It is for instrumentation that spans the whole call, such
	// as a tracing span that is the parent of every attempt's, and must
	// call do once, with ctx or a context derived from it, and return its
	// results unchanged; OnAttempt and OnAttemptStart then get that
	// context. do checks the chain first, so WrapDo sees the [ErrConfig]
	// error of a chain set up wrong too. nil means Do does the work
	// itself.
	WrapDo func(ctx context.Context, do func(ctx context.Context) (Resp, error)) (Resp, error)
	// MaxRawText is the most bytes of a model's raw output that an
	// attempt's record keeps: a broken server can send a gigabyte, and the
	// records go into errors, logs and dead-letter tables. Longer output is
	// cut at a character boundary and marked with " [llmretry: N bytes
	// cut]". 0 means DefaultMaxRawText; negative means no limit. The
	// backend's own Failure keeps its RawText whole.
	MaxRawText int
	// Continue lets a call go on when an attempt fails after it
	// delivered part of the answer ([Emit]): a stream cut, stalled,
	// garbled or ended by an error inside it. By default the call stops
	// there (Why [WhyDelivered]), since resending would deliver the
	// answer twice. With Continue, it goes on by the usual rules, the
	// same backend's retry or the next backend, but only to a backend
	// whose [Backend.CanContinue] says it can continue from what the
	// caller holds: that attempt is told the text already delivered
	// ([Continuing]) and hands only what follows to the caller, and a
	// backend that cannot is passed over (Why [WhyCannotContinue]). Where
	// none can, the call stops as it would without Continue, or starts
	// again with Restart. Each attempt's record says how many bytes it
	// continued from (Attempt.ContinuedFrom), and the answer returned is
	// always whole. An attempt that was truncated or refused after
	// delivering ends the call: its answer ended for a reason about it. A
	// backend that hands text over with [Delivered] alone cannot be
	// continued, since what the caller holds is not known; nor is a
	// nested chain's, whose enclosing chain decides.
	Continue bool
	// Restart lets a call whose caller holds part of an answer that no
	// remaining backend can continue (or any, without Continue) start the
	// answer again: the call's stream ([WithStream], [Chain.Stream]) is
	// sent a [Chunk] with Restart set, to discard what it holds, and the
	// next attempt streams a whole new answer (Attempt.Restarted). It
	// takes a call that streams: a backend's own consumer, such as
	// openairetry's emit, is not told, and without a stream the call stops
	// as it would without Restart.
	Restart bool
	// FailOverRefused makes an attempt the provider refused for its
	// content ([KindRefused]) fail over to the next backend. By default
	// it ends the chain with the provider's reason (Why "refused"): one
	// provider's safety system refused the request, and another's may be
	// weaker, so sending it on is a choice for the caller to make.
	FailOverRefused bool
}

// DefaultMaxRawText is how many bytes of a model's raw output a record
// keeps when [Chain.MaxRawText] is zero.
const DefaultMaxRawText = 64 << 10

// configError is a configuration mistake: it wraps ErrConfig and
// declares the same advice itself, so that a probe of the error as Do
// returns it stops there, as it does for the chain's other errors.
type configError struct{ msg string }

func (e *configError) Error() string       { return e.msg }
func (e *configError) Unwrap() error       { return ErrConfig }
func (e *configError) ItemRetryable() bool { return false }

// Validate reports the first configuration mistake in the chain, or nil:
// no backends, a nil Call, a negative wait, Timeout, StallTimeout,
// MaxTries or Breaker Failures, Cooldown, StoreTimeout or ProbeLease, a
// Breaker Store without a Key, a Jitter outside [0, 1], or
// Reserve, MaxWait, Jitter or MaxTries set while Waits is empty. The error names the backend by index
// and Model, as in "llmretry: backend 1 (gpt-4o): wait 2 is negative",
// and wraps [ErrConfig]. Do runs the same checks before calling any
// backend.
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
	if len(b.Pool) > 0 {
		if b.Call != nil || b.Breaker != nil {
			return bad("a pool's backend has no call or breaker of its own: each deployment has its own")
		}
		if err := validatePool(b.Pool, bad); err != nil {
			return err
		}
	} else if b.Call == nil {
		return bad("call is nil")
	}
	if p := b.problem(true); p != "" {
		return bad(p)
	}
	return nil
}

// problem is what is wrong with b's settings, "" when nothing is: its
// Timeout, StallTimeout and Breaker, and with policy set its Retry too.
func (b *Backend[Req, Resp]) problem(policy bool) string {
	if b.Timeout < 0 {
		return "timeout " + b.Timeout.String() + " is negative"
	}
	if b.StallTimeout < 0 {
		return "stall timeout " + b.StallTimeout.String() + " is negative"
	}
	if br := b.Breaker; br != nil && (br.Failures < 0 || br.Cooldown < 0) {
		return "breaker failures or cooldown is negative"
	}
	if br := b.Breaker; br != nil && br.Store != nil && br.Key == "" {
		// Without a key the processes would not know they share a backend.
		return "breaker store has no key"
	}
	if br := b.Breaker; br != nil && (br.StoreTimeout < 0 || br.ProbeLease < 0) {
		return "breaker store timeout or probe lease is negative"
	}
	if !policy {
		return ""
	}
	p := &b.Retry
	for j, w := range p.Waits {
		if w < 0 {
			return "wait " + strconv.Itoa(j+1) + " is negative"
		}
	}
	if p.MaxTries < 0 {
		return "max tries " + strconv.Itoa(p.MaxTries) + " is negative"
	}
	if math.IsNaN(p.Jitter) || p.Jitter < 0 || p.Jitter > 1 {
		return "jitter " + strconv.FormatFloat(p.Jitter, 'g', -1, 64) + " is outside [0, 1]"
	}
	// A policy with settings but no waits is almost always a forgotten
	// Waits list; treating it as "no retries" would hide the mistake.
	if len(p.Waits) == 0 {
		switch {
		case p.Reserve != 0:
			return "reserve is set but waits is empty"
		case p.MaxWait != 0:
			return "max wait is set but waits is empty"
		case p.Jitter != 0:
			return "jitter is set but waits is empty"
		case p.MaxTries != 0:
			return "max tries is set but waits is empty"
		}
	}
	return ""
}

// cost is what b's Estimate says req will use; not known without one.
func (b *Backend[Req, Resp]) cost(req Req) cost {
	if b.Estimate == nil {
		return cost{}
	}
	u := b.Estimate(req)
	return cost{in: max(u.InputTokens, 0), out: max(u.OutputTokens, 0)}
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
// Do called under the context an attempt of another chain gave its
// backend's Call (a nested chain) makes one attempt per backend and never
// waits, with Why [WhyNested], when that attempt may be retried: its
// backend's Retry has Waits, or its chain is itself nested so. The
// enclosing chain then owns the retries, so they do not multiply. Under an
// attempt whose backend has no Waits and whose chain is not nested so, or
// under a [Standalone] context, Do retries by its own policies. An inner
// chain's error is recorded in the outer attempt with the Kind that the
// outer chain's Classify gives it ([Classify] when nil).
//
// Do runs the backends and OnAttempt on the calling goroutine. It starts
// no goroutine of its own (the timers of Timeout and StallTimeout run
// their callbacks as timers do), except that a [Breaker] with a Store may
// call its store and watch it on goroutines of its own while calls use
// it. Do stops every timer it starts before it returns. A success without
// Timeout, StallTimeout or Breaker reads the clock twice and allocates
// once, for the attempt's context. With [Chain.WrapDo] set, the call runs
// inside it.
func (c *Chain[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	if c != nil && c.WrapDo != nil {
		return c.WrapDo(ctx, func(ctx context.Context) (Resp, error) { return c.do(ctx, req) })
	}
	return c.do(ctx, req)
}

// do is Do without WrapDo.
func (c *Chain[Req, Resp]) do(ctx context.Context, req Req) (Resp, error) {
	var zero Resp
	if err := c.Validate(); err != nil {
		return zero, err
	}
	if ctx == nil {
		return zero, &configError{"llmretry: context is nil"}
	}
	var r run[Req, Resp]
	c.begin(ctx, &r)
	for !r.plan.done() {
		bi := r.plan.backend()
		resp, l, err, final := r.backend(&c.Backends[bi], bi, req)
		if final {
			return resp, err
		}
		r.plan = r.plan.next(bi, l)
	}
	// Reached only when the caller holds part of an answer that no
	// backend left could continue after all (see prepare): the call
	// stops with the records it has.
	r.keep("")
	return zero, r.fail(ctx.Err(), context.Cause(ctx))
}

// run is the state of one Do.
type run[Req, Resp any] struct {
	c        *Chain[Req, Resp]
	ctx      context.Context
	parent   *attemptCtx // the enclosing chain's attempt, nil when there is none
	nested   bool        // an enclosing attempt may be retried: make one attempt per backend
	start    time.Time   // the call's first clock reading, taken as when Do began: its place in a breaker's line; zero until then
	plan     plan
	attempts []Attempt // the records kept so far

	// The record handed to OnAttempt last, which Do keeps once it has
	// carried out its decision (or the caller's context cut it short).
	pending Attempt
	handed  bool

	// The call's stream, and what the caller holds of the answer, for
	// Continue and Restart.
	sink       *sink         // the call's stream (WithStream), nil when it does not stream
	held       string        // the text delivered since the answer last began
	bare       bool          // text reached the caller past Emit: what it holds is not known
	resume     any           // the resume state of the last attempt that set one (SetResume)
	resumeOf   int           // the backend whose attempt set resume
	cannot     []int         // backends that refused a continuation in this call
	cont       *Continuation // what the next request continues, set by prepare
	restarting bool          // the next request sent begins the answer again

	// The pool of the backend the call is on, nil when it is none: the
	// deployment of its records.
	pool *poolRun[Req, Resp]
}

// reportUsageUp adds what this call cost, every attempt it made (answer
// is the usage of the one that answered, nil for a call that failed), to
// the enclosing chain's attempt, when there is one: an LM that wraps an LM
// is billed for the inner chain's attempts, and for each inner call it
// makes. Do calls it once, as it returns.
func (r *run[Req, Resp]) reportUsageUp(answer *Usage) {
	if r.parent == nil {
		return
	}
	total, known := knownUsage(r.attempts)
	if answer != nil {
		total, known = total.Add(*answer), true
	}
	if known {
		r.parent.addNested(total)
	}
}

// begin sets up r, a zero run, for one Do under ctx.
func (c *Chain[Req, Resp]) begin(ctx context.Context, r *run[Req, Resp]) {
	r.c, r.ctx, r.plan = c, ctx, newPlan(len(c.Backends))
	// Only the outermost retrying request retries: an LM that wraps an LM
	// would otherwise turn k retries into (k+1)² requests.
	r.parent, _ = ctx.Value(markKey{}).(*attemptCtx)
	r.nested = r.parent != nil && r.parent.retrying
	r.sink = sinkOf(ctx)
}

// now reads the clock; the call's first reading is when it began.
func (r *run[Req, Resp]) now() time.Time {
	t := time.Now()
	if r.start.IsZero() {
		r.start = t
	}
	return t
}

// backend sends req to backend b (index bi) and retries it as its policy
// and breaker allow. It returns how the call left the backend, or, with
// final, Do's result.
func (r *run[Req, Resp]) backend(b *Backend[Req, Resp], bi int, req Req) (resp Resp, l left, err error, final bool) {
	var line *waiter // the call's place in its target's breaker's line, from a retry's wait to the next admission
	target, c := b, cost{}
	if len(b.Pool) > 0 {
		// Every record handed from here on names its deployment.
		r.pool = newPoolRun(b, req)
		defer func() { r.pool = nil }()
	} else {
		c = b.cost(req)
	}
	pool := r.pool
	// A backend come back to goes on with its tries and its waits where
	// it left them: len(Waits) bounds its retries in the call. A try is
	// a request sent: a skip that goes on to another deployment of a pool
	// leaves the next request the same Try.
	for try := sentTo(r.attempts, bi) + 1; ; {
		if err := r.ctx.Err(); err != nil {
			target.Breaker.leave(line, r.deadline())
			r.keep(whyCtx(err))
			return resp, l, r.fail(err, context.Cause(r.ctx)), true
		}
		if pool != nil {
			next, nc := pool.target(r.now())
			if next.Breaker != target.Breaker {
				// The call's place in line after its wait is in the
				// breaker it waited for, not in the one chosen now.
				target.Breaker.leave(line, r.deadline())
				line = nil
			}
			target, c = next, nc
		}
		if !r.prepare(bi) {
			// The caller holds part of the answer, which this backend
			// cannot continue: not sent.
			target.Breaker.leave(line, r.deadline())
			return resp, left{why: WhyCannotContinue}, nil, false
		}
		// A deployment chosen by a state the fleet has since changed may
		// hold the request back: skipped, as if not the last backend,
		// while the pool has another to try first.
		r.plan.others = pool.others()
		t, skip, ok := r.admit(target, bi, try, line, c)
		r.plan.others = false
		line = nil
		if err := r.ctx.Err(); ok && err != nil {
			// The caller withdrew while OnAttempt heard of a wait for the
			// breaker: send nothing, and give the probe, if it was one, to
			// the next call.
			if target.Breaker != nil {
				target.Breaker.observe(time.Now(), t, &outcome{kind: KindCancelled}, r.boundsOf(&b.Retry))
			}
			r.keep(whyCtx(err))
			return resp, l, r.fail(err, context.Cause(r.ctx)), true
		}
		if !ok {
			if pool.skipped(r, &skip, r.now()) {
				// To the pool's next-best deployment, at once: this one
				// is closed to the request, not the pool. A skip that
				// pacing decided still says so.
				skip.Next, skip.RetryIn = NextRetry, 0
				if skip.Why != WhyPaced {
					skip.Why = ""
				}
				r.hand(&skip)
				continue
			}
			r.hand(&skip)
			if skip.Next == NextStop {
				r.keep("")
				return resp, l, r.stopped(skip.Why), true
			}
			return resp, left{why: skip.Why, kind: skip.Kind, skipped: true}, nil, false
		}
		st := r.sendOne(b, target, bi, try, req, t, c)
		try++
		if st.final || st.leave {
			return st.resp, st.l, st.err, st.final
		}
		line = st.line
	}
}

// step is where a request sent leaves the call: Do returns resp and err
// (final), the call leaves the backend as l says (leave), or, neither, it
// sends again, from line, its place in the breaker's line after its wait.
type step[Resp any] struct {
	resp  Resp
	l     left
	err   error
	final bool
	leave bool
	line  *waiter
}

// sendOne sends try number try of the call on backend b to target (b
// itself, or the deployment of b's pool chosen for it), let through with
// ticket t, its request estimated at c, and carries out what follows: a
// wait before the next try included. It holds the attempt's values (see
// tried), off the stack of a call waiting in a breaker's line.
func (r *run[Req, Resp]) sendOne(b, target *Backend[Req, Resp], bi, try int, req Req, t ticket, c cost) (st step[Resp]) {
	var s tried[Resp]
	r.attempt(target, bi, try, req, t, &s)
	a, end := &s.a, &s.end
	st.resp = s.resp
	pool := r.pool
	if a.Err == nil {
		r.keep("")
		pool.name(a)
		r.notify(*a)
		r.reportUsageUp(a.Usage)
		st.final = true
		return st
	}
	d := r.decide(b, a, end, pool.try(a.Try))
	if pool.hop(r, a, d) {
		// To the next-best deployment, at once: this one's health or
		// limits failed the request, not the request itself.
		d = decision{next: NextRetry, at: end.at}
	}
	a.Next, a.Why, a.RetryIn = d.next, d.why, d.wait
	r.hand(a)
	switch d.next {
	case NextStop:
		// The outcome is the state when the attempt ended, whatever
		// happened during OnAttempt.
		r.keep("")
		st.err, st.final = r.fail(end.ctxErr, end.cause), true
		return st
	case NextFailOver:
		st.l, st.leave = left{why: d.why, kind: a.Kind}, true
		return st
	}
	if pool.hopped() {
		return st
	}
	var cut Why
	if st.line, cut = r.wait(target, d, c); cut != "" {
		r.keep(cut)
		st.err, st.final = r.fail(r.ctx.Err(), context.Cause(r.ctx)), true
		return st
	}
	pool.waited()
	return st
}

// tried is what one request sent came to: the backend's response, the
// attempt's record, and the state of the world when its Call returned.
// The caller owns it and the attempt fills it in. These values, and the
// rate-limit reports and outcomes the Breaker is told, are large (a
// record is 216 bytes, an end state 416, a report 296): passed by value
// down Do's frames, and built in frames that stay on the stack under the
// Call, they made every waiting call's stack 16 KB rather than 8
// (BenchmarkWaiting, BenchmarkParked). So they go by pointer, and
// what is built after the Call returns is built in functions of its own
// (record, tell).
type tried[Resp any] struct {
	resp Resp
	a    Attempt
	end  ended
}

// ended is the state of the world when an attempt's Call returned.
type ended struct {
	at        time.Time
	ctxErr    error       // the caller's context's Err, nil while it was live
	cause     error       // context.Cause of the caller's context, or, for a withdrawal the backend reported, its error
	own       bool        // the backend's Timeout or StallTimeout ended the attempt
	limits    limitReport // the attempt's freshest rate-limit report, from ReportLimits or its Failure
	hasLimits bool        // limits holds one

	// What the attempt did that the caller saw.
	output    bool   // the attempt produced output (Delivered or Progress) before it ended
	emitted   string // the text the attempt handed to Emit
	bare      bool   // the attempt called Delivered: text reached the caller past Emit
	resume    any    // the attempt's last SetResume, when resumeSet
	resumeSet bool
}

// attempt sends try number try to backend b and tells its breaker, if it
// has one, how it went (t is the admission it gave), even when the
// backend's Call panics.
func (r *run[Req, Resp]) attempt(b *Backend[Req, Resp], bi, try int, req Req, t ticket, out *tried[Resp]) {
	br := b.Breaker
	if br == nil {
		r.send(b, bi, try, req, out)
		return
	}
	finished := false
	defer func() {
		if !finished {
			// Nothing was learned, but a probe must not hold the breaker
			// half-open for good.
			br.observe(time.Now(), t, &outcome{kind: KindCancelled}, r.boundsOf(&b.Retry))
		}
	}()
	r.send(b, bi, try, req, out)
	finished = true
	r.tell(br, b, t, out)
}

// tell tells br, backend b's breaker, how the attempt it let through with
// ticket t went, as out records it.
func (r *run[Req, Resp]) tell(br *Breaker, b *Backend[Req, Resp], t ticket, out *tried[Resp]) {
	a, end := &out.a, &out.end
	o := outcome{ok: a.Err == nil, kind: a.Kind, hint: a.RetryAfter, rep: end.limits, hasRep: end.hasLimits}
	if u := a.Usage; u != nil {
		o.used = cost{in: u.InputTokens, out: u.OutputTokens}
	}
	if end.ctxErr != nil {
		// The caller's own cancel or deadline ended it: that says
		// nothing about the backend's health, though its rate-limit
		// report, if it made one, is as good as any.
		o.ok, o.kind, o.hint = false, KindCancelled, 0
	}
	br.observe(end.at, t, &o, r.boundsOf(&b.Retry))
}

// send makes one attempt of backend b, try number try, and fills in out
// with its response and record. For a failure, the record has its Kind
// and details; decide sets what follows.
func (r *run[Req, Resp]) send(b *Backend[Req, Resp], bi, try int, req Req, out *tried[Resp]) {
	ctx := r.ctx
	if r.c.OnAttemptStart != nil {
		if hc := r.c.OnAttemptStart(ctx, bi, modelName(b.Model), try); hc != nil {
			ctx = hc
		}
	}
	mark := &attemptCtx{Context: ctx, parent: r.parent, retrying: r.nested || len(b.Retry.Waits) > 0, sink: r.sink, cont: r.cont}
	mark.sent = r.now()
	var err error
	var own bool
	out.resp, err, own = b.callLimited(mark, req)
	r.record(b, bi, try, mark, err, own, out)
}

// record fills in out's record and end state: of attempt mark, try
// number try of backend b (index bi), whose Call returned err; own
// reports that the backend's Timeout or StallTimeout ended it.
func (r *run[Req, Resp]) record(b *Backend[Req, Resp], bi, try int, mark *attemptCtx, err error, own bool, out *tried[Resp]) {
	start := mark.sent
	emitted, resume, resumeSet := mark.end()
	elapsed := time.Since(start)
	out.end = ended{
		at: start.Add(elapsed), ctxErr: r.ctx.Err(), own: own, output: mark.output.Load(),
		emitted: emitted, bare: mark.bare.Load(), resume: resume, resumeSet: resumeSet,
	}
	out.a = Attempt{
		Backend: bi, Model: modelName(b.Model), Try: try, Err: err,
		Start: start, Elapsed: elapsed, Delivered: mark.delivered.Load(), Restarted: r.restarting,
	}
	a, end := &out.a, &out.end
	if r.cont != nil {
		a.ContinuedFrom = len(r.cont.Text)
	}
	r.cont, r.restarting = nil, false
	r.took(bi, end)
	if b.Breaker != nil {
		end.hasLimits = mark.reported(&end.limits)
	}
	if err == nil {
		a.Usage = mark.cost(nil, nil)
		return
	}
	kind, d := outcomeOf(err)
	a.Usage = mark.cost(d.usage, err)
	if d.limits != nil && b.Breaker != nil {
		end.addFailureReport(d.limits, start)
	}
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
}

// admit asks backend b's breaker whether try number try may be sent, and
// returns the admission it gave. While the breaker is closed to the call
// it records a skipped attempt and reports false: the call fails over,
// or, when b is the last backend it can try, waits for the breaker within
// the bound that [Backend.Breaker] states, and stops when that is not
// enough. A wait that ends in the request being sent is recorded, when it
// ends, as a skip whose Next is retry and RetryIn the time waited. line
// is the call's place in the breaker's line, kept over the wait before
// this retry; nil when none.
func (r *run[Req, Resp]) admit(b *Backend[Req, Resp], bi, try int, line *waiter, c cost) (t ticket, skip Attempt, ok bool) {
	br := b.Breaker
	if br == nil {
		return t, skip, true
	}
	now := r.now()
	v := br.admit(now, line, r.deadline(), c, r.start)
	if v.pass {
		return v.t, skip, true
	}
	var (
		began time.Time // when the call began to wait for the breaker; zero while it only waits for its turn
		end   time.Time // the longest it may wait
		held  = v       // what holds it back: its record's reason
	)
	for {
		if !v.turn {
			var ok bool
			if began, end, skip, ok = r.bound(b, bi, try, now, v); !ok {
				br.leave(line, r.deadline())
				return t, skip, false
			}
			held = v
		} else {
			end = now.Add(maxOpen) // its turn comes a handOff after the call ahead of it
		}
		w := br.wait(now, line, r.start, end, v, r.deadline(), c)
		line = w
		// The breaker ends the wait: it lets the call through, or
		// dismisses it when its turn cannot come by end (at end itself
		// at the latest).
		var (
			got  verdict
			sent bool
		)
		select {
		case <-w.done:
			got, sent = br.claim(w)
		case <-r.ctx.Done():
			if time.Now().Before(end) {
				br.leave(w, r.deadline())
				return t, r.skip(b, bi, try, began, time.Now(), held, NextStop, whyCtx(r.ctx.Err())), false
			}
			// At the bound itself the breaker decides, whichever timer
			// fired first.
			got, sent = br.expire(time.Now(), w, r.deadline())
		}
		if !sent {
			br.leave(w, r.deadline()) // with a Store, out of the fleet's line too
		}
		now = r.now()
		if sent {
			if !began.IsZero() {
				r.handLetThrough(br, got.t, r.boundsOf(&b.Retry), r.waited(b, bi, try, began, now, held))
			}
			return got.t, skip, true
		}
		if !began.IsZero() {
			// Waited for the breaker in vain.
			if got.until.IsZero() {
				got = held
			}
			why := whyHeld(got)
			if deadline, ok := r.ctx.Deadline(); ok && !now.Before(deadline) {
				why = WhyDeadline
			}
			return t, r.skip(b, bi, try, began, now, got, NextStop, why), false
		}
		// Its turn will not come now: decide again, as a call that has
		// just come to the breaker.
		v, line = got, nil
	}
}

// bound is the wait of a call held back by verdict v at now: when it
// began, and the latest it may end, by the rule on [Backend.Breaker].
// When the call may not wait (b is not the last backend it can try, or
// the breaker would not let it through in time) it returns the skip
// that records it, and false.
func (r *run[Req, Resp]) bound(b *Backend[Req, Resp], bi, try int, now time.Time, v verdict) (began, end time.Time, skip Attempt, ok bool) {
	why := whyHeld(v)
	if last := r.plan.last(v.kind); !last || r.nested {
		// Fail over; a nested chain never waits: its skip's
		// RetryAfter becomes the enclosing attempt's hint.
		return began, end, r.skip(b, bi, try, time.Time{}, now, v, giveUp(why, last), why), false
	}
	// The last backend the call can try: wait for it, within the bound,
	// counted for a pool from its first deployment waited for.
	began, end = now, r.waitLimit(&b.Retry, r.pool.waitFrom(now))
	if d, bounded := r.waitsOf(&b.Retry); bounded && !v.hinted {
		// Counted from when the call first came to the backend: without
		// a breaker it would have been retrying it since.
		end = minTime(end, r.cameTo(bi, now).Add(d))
	}
	if deadline, ok := r.ctx.Deadline(); ok && !now.Before(deadline) {
		return began, end, r.skip(b, bi, try, time.Time{}, now, v, NextStop, WhyDeadline), false
	}
	if !now.Before(end) || (!v.until.IsZero() && (v.until.After(end) || !r.fits(&b.Retry, v.until.Sub(now), now))) {
		return began, end, r.skip(b, bi, try, time.Time{}, now, v, NextStop, why), false
	}
	return began, end, skip, true
}

// whyHeld is the reason a record gives for a call the breaker held back
// by verdict v.
func whyHeld(v verdict) Why {
	if v.paced {
		return WhyPaced
	}
	return WhyBreaker
}

// handLetThrough hands over the record of a wait that ended with the call
// let through with admission t. OnAttempt runs before the request is
// sent, and a panic there must not leave the breaker half-open for good,
// with no probe in flight to end it, nor count a request in flight that
// never went.
func (r *run[Req, Resp]) handLetThrough(br *Breaker, t ticket, cb callBounds, a Attempt) {
	handed := false
	defer func() {
		if !handed {
			br.observe(time.Now(), t, &outcome{kind: KindCancelled}, cb)
		}
	}()
	r.hand(&a)
	handed = true
}

// addFailureReport adds the rate-limit report of the attempt's Failure,
// of the request sent at start, to e's, when it is the fresher.
// StatusFailure read the headers without knowing the send. A Failure
// built before the attempt (a fake's, say) was read earlier still: its
// times move with its read, never early.
func (e *ended) addFailureReport(l *limitReport, start time.Time) {
	rep := *l
	if shift := start.Sub(rep.read); shift > 0 {
		rep.read = start
		rep.retryAt = shiftTime(rep.retryAt, shift)
		rep.requests.next = shiftTime(rep.requests.next, shift)
		rep.tokens.next = shiftTime(rep.tokens.next, shift)
		rep.inputTokens.next = shiftTime(rep.inputTokens.next, shift)
		rep.outputTokens.next = shiftTime(rep.outputTokens.next, shift)
	}
	rep.sent = start
	if !e.hasLimits || fresher(&rep, &e.limits) {
		e.limits, e.hasLimits = rep, true
	}
}

// shiftTime is t moved later by d; the zero time, which means none, stays.
func shiftTime(t time.Time, d time.Duration) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(d)
}

// cameTo is when the call first came to backend bi: the start of its
// first record of bi, or now when it has none.
func (r *run[Req, Resp]) cameTo(bi int, now time.Time) time.Time {
	for i := range r.attempts {
		if r.attempts[i].Backend == bi {
			return r.attempts[i].Start
		}
	}
	if r.handed && r.pending.Backend == bi {
		return r.pending.Start
	}
	return now
}

// waitsOf is the time a call spends waiting between the tries of a
// backend with policy p, without a breaker, from its first try to its
// last: the listed waits, and a repeating last wait as often as MaxTries
// allows (once without it). bounded is false only when the sum is too
// long for any clock to reach. Jitter is left out: it only shortens
// waits.
func (r *run[Req, Resp]) waitsOf(p *Policy) (d time.Duration, bounded bool) {
	n := len(p.Waits)
	_, hasDeadline := r.ctx.Deadline()
	repeats := hasDeadline && n > 0 && p.Waits[n-1] > 0
	// Retry t waits Waits[t-1] for t up to the last retry, and past the
	// list the repeated last wait.
	retries := n
	switch {
	case p.MaxTries > 0 && repeats:
		retries = p.MaxTries - 1
	case p.MaxTries > 0:
		retries = min(n, p.MaxTries-1)
	}
	for _, w := range p.Waits[:min(retries, n)] {
		if w > maxOpen-d {
			return 0, false // longer than anything else bounds
		}
		d += w
	}
	if more := retries - n; more > 0 {
		rep := max(p.Waits[n-1], minRepeat)
		if time.Duration(more) > (maxOpen-d)/rep {
			return 0, false
		}
		d += time.Duration(more) * rep
	}
	return d, true
}

// waited is the record of a call that waited for backend b's breaker from
// began until now, when try number try was let through; v is the last
// verdict that held it back.
func (r *run[Req, Resp]) waited(b *Backend[Req, Resp], bi, try int, began, now time.Time, v verdict) Attempt {
	a := Attempt{
		Backend: bi, Model: modelName(b.Model), Try: try, Kind: v.kind,
		Start: began, Skipped: true, Next: NextRetry, RetryIn: now.Sub(began),
	}
	if v.paced {
		// Held by the provider's rate limits, not by a failure: the
		// record says so, though the request did go.
		a.Why = WhyPaced
	}
	if !v.until.IsZero() {
		a.RetryAfter = max(v.until.Sub(began), 0)
	}
	return a
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

// skip is the record of try number try of backend b, not sent because its
// breaker was open (v), and of what the call did instead.
func (r *run[Req, Resp]) skip(b *Backend[Req, Resp], bi, try int, began, now time.Time, v verdict, next Next, why Why) Attempt {
	a := Attempt{
		Backend: bi, Model: modelName(b.Model), Try: try, Kind: v.kind,
		Start: now, Skipped: true, Next: next, Why: why,
	}
	if !began.IsZero() {
		// Waited for the breaker, in vain: the record spans the wait.
		a.Start, a.Elapsed = began, now.Sub(began)
	}
	if !v.until.IsZero() {
		a.RetryAfter = max(v.until.Sub(now), 0) // when the backend takes work again, for RetryItemAfter
	}
	return a
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

// decision is what Do decided after a failed attempt: what it does next,
// why it does not retry, and the wait before a retry, measured from at.
type decision struct {
	next Next
	why  Why
	wait time.Duration
	at   time.Time // the clock reading it was decided at: when the attempt ended
}

// decide decides what follows failed attempt a of backend b, which ended
// as end says; try is the number by which b's policy reads its next wait
// (a.Try, but for a pool: see poolRun.try).
func (r *run[Req, Resp]) decide(b *Backend[Req, Resp], a *Attempt, end *ended, try int) decision {
	d := r.decideUsual(b, a, end, try)
	if r.holds() && r.mayRecover() && d.why != WhyDelivered && d.why != WhyCancelled && d.why != WhyDeadline {
		d = r.recover(b, a, end, d)
	}
	return d
}

// decideUsual decides what follows failed attempt a of backend b by the
// rules for an answer the caller holds nothing of; one it holds part of
// ends the call, unless the call may go on from it (recover).
func (r *run[Req, Resp]) decideUsual(b *Backend[Req, Resp], a *Attempt, end *ended, try int) decision {
	var why Why
	switch {
	case a.Kind == KindCancelled:
		why = WhyCancelled
	case end.ctxErr != nil:
		why = WhyDeadline
	case r.holds() && (!r.mayRecover() || a.Kind == KindTruncated || a.Kind == KindRefused):
		// The caller already holds part of this answer: resending would
		// duplicate it, and so would another backend; and an answer that
		// hit its budget or was refused ended for a reason about it.
		why = WhyDelivered
	case a.ContinuedFrom > 0 && errors.Is(a.Err, ErrCannotContinue):
		// The backend refused to continue: recover takes the call on.
		why = WhyCannotContinue
	case a.Kind == KindRefused && !r.c.FailOverRefused:
		why = WhyRefused
	case !a.Kind.Retryable():
		why = WhyNotRetryable
	case r.nested:
		why = WhyNested
	case a.Kind == KindTimeout && !end.output && b.Retry.FailOverSilent && !r.plan.last(a.Kind):
		// Silent from its start to its end: the same backend is likely
		// silent again, and the caller is waiting. Another backend may
		// not be.
		why = WhySilent
	default:
		var w time.Duration
		w, why = r.nextWait(b, try, a.Try, a.RetryAfter, end.at)
		if why == "" && !r.plan.last(a.Kind) && b.Breaker.openPast(end.at.Add(w)) {
			// The breaker will still be open when the wait ends: the retry
			// would only skip, so fail over now rather than after the wait.
			why = WhyBreaker
		}
		if why == "" {
			return decision{next: NextRetry, wait: w, at: end.at}
		}
	}
	return decision{next: giveUp(why, r.plan.last(a.Kind)), why: why, at: end.at}
}

// giveUp is what follows an attempt that is not retried for reason why.
func giveUp(why Why, last bool) Next {
	switch {
	case last, why == WhyCancelled, why == WhyDeadline, why == WhyDelivered, why == WhyRefused:
		return NextStop
	}
	return NextFailOver
}

// nextWait returns the wait before the retry that follows failed try
// number try, decided at now, or why there is none; sent is the requests
// sent to the backend so far, which MaxTries bounds (more than try for a
// pool, whose deployments are tried in turn between the waits). hint is
// the server's retry-after.
func (r *run[Req, Resp]) nextWait(b *Backend[Req, Resp], try, sent int, hint time.Duration, now time.Time) (time.Duration, Why) {
	p := &b.Retry
	_, hasDeadline := r.ctx.Deadline()
	n := len(p.Waits)
	var w time.Duration
	switch {
	case p.MaxTries > 0 && sent >= p.MaxTries:
		return 0, WhyWaitsUsed
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

// deadline is the caller's deadline; zero when it has none.
func (r *run[Req, Resp]) deadline() time.Time {
	d, _ := r.ctx.Deadline()
	return d
}

// boundsOf is what of the call bounds a Breaker's work for it, on a
// backend with policy p.
func (r *run[Req, Resp]) boundsOf(p *Policy) callBounds {
	return callBounds{maxWait: maxWait(p), deadline: r.deadline()}
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
	case p.Reserve < 0:
		return 0
	case p.Reserve > 0:
		return p.Reserve
	}
	// A 60s reserve under a 30s deadline would turn off every retry, even
	// the zero waits; half of what was left keeps room for both.
	if deadline, ok := r.ctx.Deadline(); ok {
		return min(DefaultReserve, deadline.Sub(r.start)/2)
	}
	return DefaultReserve
}

// wait carries out decision d, a retry of backend b: it sleeps until the
// wait, measured from the decision, ends (OnAttempt's time is part of
// it), and returns the call's place in the breaker's line. It returns why
// instead when the caller's context ended first.
func (r *run[Req, Resp]) wait(b *Backend[Req, Resp], d decision, c cost) (*waiter, Why) {
	if err := r.ctx.Err(); err != nil {
		return nil, whyCtx(err)
	}
	ready := d.at.Add(d.wait)
	var line *waiter
	if b.Breaker != nil {
		// In the breaker's line from now, to come to it when the wait
		// ends: a call coming back after a retry-after goes before those
		// that began later.
		line = b.Breaker.join(r.start, ready, c)
	}
	if d.wait == 0 {
		return line, "" // no timer for a zero wait
	}
	t := time.NewTimer(time.Until(ready))
	defer t.Stop()
	select {
	case <-r.ctx.Done():
		b.Breaker.leave(line, r.deadline())
		return nil, whyCtx(r.ctx.Err())
	case <-t.C:
		return line, ""
	}
}

// hand hands record a to OnAttempt, once Do has decided what follows it.
// Do keeps it when it carries the decision out (keep). On a pool, the
// record names the deployment it is of, and why it was chosen.
func (r *run[Req, Resp]) hand(a *Attempt) {
	r.keep("")
	r.pending = *a
	r.handed = true
	r.pool.name(&r.pending)
	r.notify(r.pending)
}

// keep adds the record handed last, if any, to the call's records. cut,
// when set, is why the caller's context stopped the call before the
// record's retry or fail-over was carried out: the kept record then says
// that Do stopped, for that reason, even though OnAttempt was told
// otherwise.
//
// It is never inlined: each inlined copy holds a copy of the record in its
// caller's frame (see tried), and inlined, a call that failed through a
// Breaker waits for its retry on a 16 KB stack, not 8
// (BenchmarkWaiting/retry).
//
//go:noinline
func (r *run[Req, Resp]) keep(cut Why) {
	if !r.handed {
		return
	}
	a := r.pending
	if cut != "" && a.Next != NextStop {
		a.Next, a.Why, a.RetryIn = NextStop, cut, 0
	}
	r.attempts = append(r.attempts, a)
	r.pending, r.handed = Attempt{}, false
}

// notify hands an attempt to OnAttempt.
func (r *run[Req, Resp]) notify(a Attempt) {
	if r.c.OnAttempt != nil {
		r.c.OnAttempt(r.ctx, a)
	}
}

// stopped is the error of a call that stopped after a skip, for why.
func (r *run[Req, Resp]) stopped(why Why) error {
	switch why {
	case WhyCancelled:
		return r.fail(r.ctx.Err(), context.Cause(r.ctx))
	case WhyDeadline:
		// Decided at the deadline, perhaps a moment before the context's
		// own timer fired: wait for it, or its cause is not set yet.
		<-r.ctx.Done()
		return r.fail(context.DeadlineExceeded, context.Cause(r.ctx))
	}
	// Stopped for a reason of the chain's own: that decides the outcome,
	// whatever the context did meanwhile.
	return r.fail(nil, nil)
}

// fail is the error of a call that has stopped, with every record kept.
// ctxErr and cause are the caller's context's Err and Cause when it
// stopped (nil while it was live; for a withdrawal that the backend
// reported, context.Canceled and the backend's error). The records
// decide, as they do for [Exhaust]: the caller's cancellation wins over
// the attempts' own failures, and a deadline that ran out makes it a
// TimedOut (or Truncated).
func (r *run[Req, Resp]) fail(ctxErr, cause error) error {
	r.reportUsageUp(nil)
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
