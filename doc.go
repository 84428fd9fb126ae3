// Package llmretry provides a fallback chain for calls to LLM providers
// that survives outages: it sends a failed request again after a sensible
// wait, falls over to the next model when one gives up, and, when
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
//				Reserve: 60 * time.Second,
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
// # Kinds
//
// Each failed attempt has a [Kind], which decides what the chain does next:
//
//	Kind        retried in its backend   then
//	transient   yes                      falls over when its retries end
//	timeout     yes                      falls over when its retries end
//	parse       yes                      falls over when its retries end
//	truncated   no                       falls over at once
//	rejected    no                       falls over at once
//	unknown     no                       falls over at once
//	cancelled   no                       ends the chain at once
//
// An attempt ended by the caller's context is cancelled or timeout whatever
// the backend returned. An attempt ended by the backend's own Timeout is
// timeout.
//
// # Timing
//
// Retry i of a backend waits Policy.Waits[i-1], or the server's retry-after
// hint when that is longer. Without a deadline on the context, the list is
// the bound. With a deadline, the last wait repeats for as long as the
// deadline still leaves Policy.Reserve after the wait (a zero last wait
// does not repeat: back-to-back requests until the deadline would be a
// storm against a failing provider); every wait, listed
// or repeated, is checked before it starts, and one that fails the check
// ends the backend's retries (the chain falls over, or ends) rather than
// sleeping into the deadline. Retries ended that way give an [*Exhausted],
// not a [*TimedOut]: no attempt ran out of time. A retry-after hint longer
// than Policy.MaxWait also ends the backend's retries, so a broken server
// cannot park a caller for a day. Cancelling the context ends a wait at
// once.
//
// Retries cost money as well as time. A timed-out attempt may have been
// finished and billed by the provider with no response recorded, so its
// retry can be billed twice; this is more likely without a deadline, when
// only the backend's Timeout ends a slow attempt.
//
// # Errors
//
// When every backend has failed, [Chain.Do] returns one of three errors
// chosen by [Exhaust], by precedence:
//
//	[*Truncated]  an attempt was cut off at the completion budget: raise the budget (max tokens)
//	[*TimedOut]   else an attempt hit a deadline, or the caller's deadline passed: raise the deadline
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
//	case errors.As(err, &timedOut):  // raise the deadline
//	case errors.As(err, &exhausted): // every backend failed
//	}
//
// Each error carries an [Attempt] for every failed attempt, in order: which
// backend and try, the Kind, the HTTP status, the error, the model's raw
// output when there was some, timing, and the wait that followed. The
// Error text of the Exhausted family is a summary meant for people: a first
// line naming the lever to pull, then one line per attempt. Programs should
// read the fields instead. errors.Is(err, context.DeadlineExceeded) holds
// for every TimedOut, and errors.Is(err, context.Canceled) for every
// Cancelled. A Cancelled's Cause is context.Cause of the caller's context,
// or the attempt's own error when the backend reported the withdrawal;
// errors.Is sees it, but errors.As finds no Exhausted and no advice through
// it, so a context cancelled with a sibling's Truncated (as errgroup does)
// still gives a plain Cancelled.
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
// the first error that has it; an error without any is retryable. Of this
// package's errors only [*Truncated] and configuration errors ([ErrConfig])
// say no: the same request would be cut off at the same place, and a broken
// chain fails the same way. A deadline miss is transient, so [*TimedOut]
// keeps its budget. Because an [*Exhausted] unwraps to its attempts' errors,
// a backend error that declares advice of its own is heard too.
//
// # Streaming
//
// A backend that streams calls [Delivered] with its context once it hands
// the first chunk to the caller. A failure after that is never sent again
// and never falls over, since the caller already holds part of an answer:
// Do returns the typed error at once, with the attempt's Delivered set. A
// stream that fails before its first chunk is retried like any request.
//
// # Nesting
//
// Only the outermost retrying request retries. While a backend whose
// Policy has waits is in flight, its context carries a mark; a Chain whose
// Do runs under that mark (an LM that wraps an LM) makes one attempt per
// backend and never waits. k retries then cost k+1 requests, not (k+1)².
// Pass the context that Call receives to any inner chain for this to work.
//
// An inner chain's error is recorded in the outer attempt with the Kind
// that [Classify] gives it (a Truncated is truncated, a TimedOut a timeout,
// an Exhausted the Kind of its last attempt) and with the status, raw text
// and retry-after hint of its last attempt.
//
// # Concurrency
//
// A Chain is immutable once built and safe for concurrent use by many
// goroutines; all of a call's state lives on that call's stack. Do runs
// its backends and OnAttempt on the calling goroutine. It never starts a
// goroutine, and stops every timer it starts before it returns. On the
// success path without a backend Timeout it allocates once, for the
// attempt's context.
//
// # Configuration errors
//
// Do and [Chain.Validate] refuse a chain that is set up wrong before any
// backend is called: no backends, a nil Call, a negative wait or Timeout,
// a Jitter outside [0, 1], or Reserve, MaxWait or Jitter set while Waits is
// empty. The error names the backend, as in "llmretry: backend 1 (gpt-4o):
// wait 2 is negative", and wraps [ErrConfig].
package llmretry
