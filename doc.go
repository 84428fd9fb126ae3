// Package llmretry provides a fallback chain for calls to LLM providers
// that survives outages: it sends a failed request again after a sensible
// wait, fails over to the next model when one gives up, and, when
// everything fails, returns one typed error that says what happened,
// attempt by attempt, with the model's raw output kept, and whether
// re-running the item could ever help.
//
// A [Chain] holds [Backend]s in order. Each backend has a Call function and
// a retry [Policy]:
//
//	chain := &llmretry.Chain[Prompt, Answer]{
//		Backends: []llmretry.Backend[Prompt, Answer]{
//			{Model: "gpt-4o", Call: openAI, Retry: llmretry.Policy{
//				Waits: []time.Duration{15 * time.Second, 45 * time.Second, 120 * time.Second, 240 * time.Second},
//			}},
//			{Model: "claude-sonnet", Call: anthropic},
//		},
//	}
//	answer, err := chain.Do(ctx, prompt)
//
// That policy suits a host running agent turns with a deadline of several
// minutes: a provider outage costs a few requests per turn instead of the
// turn itself. A batch pipeline with no deadline gets exactly the listed
// waits and no more.
//
// A backend reports how it failed by returning a [*Failure], built with
// [StatusFailure] for an HTTP error response (status code, x-should-retry
// and retry-after are read for you), [Truncation] for a completion cut off
// at its token budget, or [ParseFailure] for output that could not be used.
// Any other error is classified by [Classify]: context errors, timeouts and
// dropped connections are recognised; the rest is [KindUnknown].
//
// A Call must return soon after its context is done, as net/http does: Do
// runs it on the caller's goroutine and waits for it, so a Call that
// ignores its context holds Do past the caller's cancel and past the
// backend's Timeout.
//
// # Kinds
//
// Each failed attempt has a [Kind], which decides what the chain does next:
//
//	Kind        retried in its backend   then
//	transient   yes                      fails over when its retries end
//	timeout     yes                      fails over when its retries end
//	parse       yes                      fails over when its retries end
//	truncated   no                       fails over at once
//	rejected    no                       fails over at once
//	unknown     no                       fails over at once
//	cancelled   no                       ends the chain at once
//
// An attempt ended by the caller's context is cancelled or timeout whatever
// the backend returned. An attempt ended by the backend's own Timeout or
// StallTimeout is timeout; the context's cause is then [ErrAttemptTimeout]
// or [ErrStalled], which HTTP clients put in their errors and Classify
// recognises. Where an error wraps one of this package's typed errors, the
// outermost of them decides the Kind, and the record's status, raw text and
// retry-after come from that same error.
//
// # Timing
//
// Retry i of a backend waits Policy.Waits[i-1], or the server's retry-after
// hint when that is longer. Without a deadline on the context, the list is
// the bound. With a deadline, the last wait repeats for as long as the
// deadline still leaves the reserve after the wait. A zero last wait does
// not repeat, and a positive one shorter than a second repeats at a second:
// back-to-back requests until the deadline would be a storm against a
// failing provider.
//
// The reserve is Policy.Reserve when set. Left zero, it is DefaultReserve
// (60s), but never more than half of the time the context had left when Do
// began: a 30s deadline reserves 15s, a 2s one 1s, a 10-minute one 60s.
// Every wait, listed or repeated, is checked before it starts, and one that
// fails the check ends the backend's retries (the chain fails over, or
// ends) rather than sleeping into the deadline. Retries ended that way give
// an [*Exhausted], not a [*TimedOut]: no attempt ran out of time. A
// retry-after hint longer than Policy.MaxWait also ends the backend's
// retries, so a broken server cannot park a caller for a day; a hint too
// long for a Duration counts as longer than any MaxWait. Cancelling the
// context ends a wait at once.
//
// An attempt's Start is when its request was sent and its Elapsed covers
// its Call alone. OnAttempt runs after the chain has decided what follows
// an attempt; the wait, if any, is checked again and started after the
// hook returns, from one reading of the clock, so a slow hook can turn a
// retry into a fail-over (the record then says why: "reserve"), but never
// into a sleep past the deadline.
//
// Backend.Timeout bounds each attempt as a whole. Backend.StallTimeout
// bounds the time an attempt goes without output: from its start to its
// first [Delivered], and between later ones. Use StallTimeout for streams,
// which may run for minutes while healthy, and Timeout for plain requests.
//
// Retries cost money as well as time. A timed-out attempt may have been
// finished and billed by the provider with no response recorded, so its
// retry can be billed twice; this is more likely without a deadline, when
// only the backend's Timeout ends a slow attempt.
//
// # Breakers
//
// A Chain learns nothing across calls by itself: in a hard-down outage every
// call spends its own retries on the dead backend before failing over. A
// [Breaker] on a backend ([Backend.Breaker]) is that backend's health,
// shared by every call and chain holding the same pointer:
//
//	state       calls                                      leaves it when
//	closed      go through                                 Failures consecutive transient or timeout failures, or one carrying a retry-after hint: open
//	open        skip the backend (a Skipped record, why    the open period (Cooldown, or the hint) ends: half-open;
//	            "breaker"); a call with no backend left    a success of an attempt sent before it opened: closed
//	            waits, as it would for a retry-after
//	half-open   one probe goes through, the waiting call   the probe's transient or timeout failure: open again;
//	            that began first; the others skip or wait  the caller's cancel or deadline, a panic, a withdrawal the Call reports: still half-open;
//	                                                       any other outcome (the backend is up): closed
//
// A call that skipped a backend comes back to it when every backend after
// it failed for a reason about the request (truncated, rejected, parse,
// unknown); a backend skipped too does not count against it. A backend
// whose retry was put off, because its breaker would still be open when
// the wait ended, is come back to in the same way; when it failed for the
// backend's health, it rules out coming back to those skipped before it. The backends to come back to are
// chosen once, when the call has been through the whole chain and the
// last backend failed for a reason about the request (a last backend
// skipped is waited for, or ends the call). The call comes back to them
// in chain order, each once: the last of them is waited for if its breaker
// is still open, the others are skipped again. A backend come back to
// goes on with its tries and its waits where it left them. On a backend
// with a Breaker a retry-after hint is the wait itself, so the caller
// that got it comes back when the breaker half-opens, with everyone else.
// [Breaker.State] reads it for dashboards.
//
// # Records
//
// Every attempt has an [Attempt] record: which backend and try, the Kind,
// the HTTP status, the error, the model's raw output when there was some
// (at most [Chain.MaxRawText] bytes of it, 64 KiB by default, the cut
// marked), the server's retry-after hint, when it started and how long it
// took, and what the chain did next and why:
//
//	Next        meaning                                        Why
//	retry       sent again to the same backend after RetryIn   (none)
//	fail_over   went on to the next backend                    not_retryable, waits_used, reserve, max_wait, nested, breaker
//	stop        Do returned                                    any of those for the last backend, or
//	                                                           delivered, deadline, cancelled
//
// not_retryable: the Kind is not retried. waits_used: the policy allows no
// further try (no waits, the list ran out without a deadline, or a zero
// last wait). reserve: the next wait would end at or past the deadline or
// leave less than the reserve. max_wait: the server's retry-after was
// longer than MaxWait. delivered: output had reached the caller. deadline:
// the caller's deadline passed. cancelled: the caller withdrew. nested:
// the chain runs inside another chain's retrying attempt. breaker: the
// backend's Breaker was open, so nothing was sent (Skipped is set), or
// would still be open when the retry's wait ended, so the retry was put
// off (the call may come back to it). A success has neither.
//
// The records in a returned error say what actually happened: a wait cut
// short by the caller's cancel or deadline reads stop, with why cancelled
// or deadline, though OnAttempt saw retry when the attempt ended. Records
// encode to JSON with snake_case keys and durations in milliseconds
// (elapsed_ms, retry_in_ms, retry_after_ms), decode to themselves, and log
// as slog groups without the model's output.
//
// # Errors
//
// When every backend has failed, [Chain.Do] returns one of three errors
// chosen by [Exhaust], by precedence:
//
//	[*Truncated]  an attempt was cut off at the completion budget: raise the budget (max tokens)
//	[*TimedOut]   else an attempt hit a deadline, or the caller's deadline passed
//	[*Exhausted]  else
//
// Truncated and TimedOut embed Exhausted, so a handler of *Exhausted keeps
// catching them; match the narrower types first. When the caller withdraws
// (its context is cancelled, or an attempt fails with [KindCancelled]), Do
// returns a [*Cancelled] at once. Cancelled is deliberately not an
// Exhausted: a user pressing Ctrl-C is not a model failure, and a handler
// that counts failures or dead-letters items must not see it as one.
//
//	var (
//		cancelled *llmretry.Cancelled
//		truncated *llmretry.Truncated
//		timedOut  *llmretry.TimedOut
//		exhausted *llmretry.Exhausted
//	)
//	switch {
//	case errors.As(err, &cancelled): // the caller withdrew
//	case errors.As(err, &truncated): // raise max tokens
//	case errors.As(err, &timedOut):  // raise the deadline or the timeouts
//	case errors.As(err, &exhausted): // every backend failed
//	}
//
// The Error text of the Exhausted family is a summary meant for people: a
// first line naming the lever to pull (the completion budget, the
// deadline — only when the caller's deadline ran out —, the backends'
// Timeout or StallTimeout, the reserve or MaxWait when they stopped the
// retries, or, when output was already delivered, that nothing was
// resent), then one line per attempt, an inner chain's attempts indented
// under the attempt that ran it; past 20 attempts, the first and last 10
// and a count of the rest. Programs should read the fields instead.
// errors.Is(err, context.DeadlineExceeded) holds for every TimedOut, and
// errors.Is(err, cause) for the cause of a deadline set with
// context.WithTimeoutCause ([TimedOut].Cause). errors.Is(err,
// context.Canceled) holds for every Cancelled, whose Cause is context.Cause
// of the caller's context, or the attempt's own error when the backend
// reported the withdrawal. errors.As finds no Exhausted and no advice
// through either Cause, so a context cancelled with a sibling's Truncated
// (as errgroup does) still gives a plain Cancelled.
//
// Each of the four errors encodes, with json.Marshal, to the record a
// dead-letter table keeps: {"outcome": "exhausted" | "truncated" |
// "timed_out" | "cancelled", "item_retryable": bool, "error": the Error
// text, "attempts": [...]}, plus "cause" where there is one.
//
// A layer that wants its own error type can wrap ours with %w, or return a
// type whose Unwrap returns ours: errors.As to *Exhausted and the advice
// below keep working for everyone above it.
//
// # Advice for orchestrators
//
// A job queue or pipeline that re-runs failed items should ask [RetryItem]
// whether running the item again could help. It probes the error tree for
// the [ItemRetryable] interface, as errors.As does, and takes the advice of
// the first error that has it; an error without any is retryable. Each of
// the four error types declares its own advice, so a probe stops at the
// outermost one, whatever lies beneath it:
//
//	[*Truncated]  false: the same request is cut off at the same place
//	[*TimedOut]   true: a deadline miss is transient
//	[*Cancelled]  true: a withdrawal says nothing about the item
//	[*Exhausted]  false when every attempt was rejected or truncated (every
//	              backend refused this exact request, and would again);
//	              true otherwise
//
// [RetryItemAfter] tells a job queue when to run the item again: when every
// backend's last attempt carried a retry-after hint (or was skipped by a
// breaker that half-opens at a known time), the time from now until the
// soonest of them, so the queue can snooze the item instead of spending an
// attempt. [*Exhausted] and [*TimedOut] give it.
//
// Configuration errors ([ErrConfig]) say false: a broken chain fails the
// same way.
//
// # Secrets
//
// net/http puts whole URLs in its errors, and some providers take the API
// key in the query. Everything this package renders from an error — every
// Error text of its own, [Attempt.String], the JSON "error" and "cause",
// the slog output — passes through [Redact], which replaces URL userinfo,
// key-like query parameters, bearer tokens and strings shaped like provider
// keys with REDACTED. Attempt.Err itself stays the backend's error, for
// errors.As.
//
// # Streaming
//
// A backend that streams calls [Delivered] with its context on every chunk
// it hands to the caller. A failure after the first is never sent again and
// never fails over, since the caller already holds part of an answer: Do
// returns the typed error at once, with the attempt's Delivered set. A
// stream that fails before its first chunk is retried like any request.
// Each Delivered also restarts the backend's StallTimeout.
//
// # Nesting
//
// Only the outermost retrying request retries. While a backend whose
// Policy has waits is in flight, its context carries a mark; a Chain whose
// Do runs under that mark (an LM that wraps an LM) makes one attempt per
// backend and never waits. k retries then cost k+1 requests, not (k+1)².
// Pass the context that Call receives to any inner chain for this to work.
// An unrelated chain that a backend calls (moderation, embeddings) should
// run under [Standalone]: it then retries by its own policy, and its
// Delivered does not mark the enclosing attempt.
//
// An inner chain's error is recorded in the outer attempt with the Kind
// that [Classify] gives it (a Truncated is truncated, a TimedOut a timeout,
// an Exhausted the Kind of its last attempt), and with the status, raw text
// and retry-after hint of the last inner attempt of that Kind.
//
// # Concurrency
//
// A Chain is immutable once built and safe for concurrent use by many
// goroutines; all of a call's state is its own. Do runs its backends and
// OnAttempt on the calling goroutine. It starts no goroutine of its own
// (the timers of Timeout and StallTimeout run their callbacks as timers
// do), and stops every timer it starts before it returns. On the success path
// without a backend Timeout or StallTimeout it allocates once, for the
// attempt's context, and starts no timer; a zero wait arms none either.
//
// # Configuration errors
//
// Do and [Chain.Validate] refuse a chain that is set up wrong before any
// backend is called: no backends, a nil Call, a negative wait, Timeout or
// StallTimeout, a Jitter outside [0, 1], or Reserve, MaxWait or Jitter set
// while Waits is empty. The error names the backend, as in "llmretry:
// backend 1 (gpt-4o): wait 2 is negative", and wraps [ErrConfig].
package llmretry
