// Package llmretry makes calls to LLM providers survive outages. A [Chain]
// sends a request to its [Backend]s in order: it sends a failed request
// again after the waits of the backend's [Policy], fails over to the next
// backend when one gives up, and, when every backend has failed, returns one
// typed error that keeps a record of every attempt and tells a job queue
// whether running the item again could help.
//
//	chain := &llmretry.Chain[string, string]{
//		Backends: []llmretry.Backend[string, string]{
//			{Model: "gpt-4o", Call: primary, Retry: llmretry.Policy{Waits: []time.Duration{time.Millisecond}}},
//			{Model: "claude-sonnet", Call: secondary},
//		},
//		OnAttempt: func(ctx context.Context, a llmretry.Attempt) { fmt.Println(a) },
//	}
//	answer, err := chain.Do(context.Background(), "hello")
//	// [backend 0 gpt-4o try 1] http 503: upstream connect error (retrying in 1ms)
//	// [backend 0 gpt-4o try 2] http 503: upstream connect error (failing over: waits_used)
//	// [backend 1 claude-sonnet try 1] ok
//
// That is Example_fallback, which runs with the tests.
//
// # Failures
//
// A backend's Call says how it failed by returning a [*Failure], built with
// [StatusFailure] for an HTTP error response, [Truncation] for an answer cut
// off at its token budget, [ParseFailure] for output that could not be
// used, or [Refusal] for content the provider refused. Any other error is
// classified by [Classify]. The failure's [Kind] decides whether the
// backend is tried again, the chain fails over, or it stops. A refusal
// stops the chain by default rather than take the request to a provider
// whose filter may be weaker; [Chain.FailOverRefused] makes it fail over.
//
// # Timing
//
// [Policy] holds the waits between tries, the reserve a wait must leave
// before the caller's deadline, the longest retry-after hint honoured
// (MaxWait) and the most tries of one backend (MaxTries). [Backend.Timeout]
// bounds an attempt and [Backend.StallTimeout] the time an attempt goes
// without output.
//
// # Breakers
//
// A [Breaker] on a backend is its health, shared by every call that holds
// the same pointer: while it is open, calls skip the backend instead of
// spending their own retries on it. It also paces the backend by the
// rate-limit headers that a Call passes to [ReportLimits], so that no
// request is sent that the provider said it would refuse. Its doc comment
// has the rules, and [Breaker.State] reads it for dashboards. Given a
// [BreakerStore], the Breakers of many processes share one state, and a
// fleet learns of an outage and paces a bucket as one process would.
//
// # Records and errors
//
// Every attempt has an [Attempt] record, whose [Next] and [Why] say what
// the chain did after it. When every backend has failed, Do returns an
// [*Exhausted], or the [*Truncated] or [*TimedOut] that embed it; when the
// caller withdraws, a [*Cancelled]. errors.Is and errors.As on those see
// the outcome only: an attempt's own error stays in its record's Err
// (Example_lastProviderError shows how to reach it). The errors and their
// records encode to JSON for dead-letter tables and log as slog groups.
// A record carries what its attempt cost when the provider said
// ([ReportUsage], [Usage]), failed attempts included, and an error's JSON
// totals it ([TotalUsage]).
//
// # Advice for orchestrators
//
// [RetryItem] says whether running a failed item again could help, and
// [RetryItemAfter] when a provider said it would take work again; each of
// the four error types declares its own advice ([ItemRetryable],
// [ItemRetryAfter]). The batch package runs many items by this advice.
//
// # Streaming and nesting
//
// A backend that streams calls [Delivered] with every chunk it hands over:
// after that, a failure is returned at once, never sent again. One that
// holds a stream's chunks and answers whole calls [Progress] instead,
// which keeps [Backend.StallTimeout] from cutting it while leaving it free
// to be sent again: the caller has seen none of it. [WithStream] and
// [Chain.Stream] stream one call to a consumer of its own; a backend
// hands its text over with [Emit]. [Chain.Continue] lets a call go on
// from text it delivered before an attempt failed, [Chain.Restart] start
// it again. A Chain run
// inside another chain's attempt makes one attempt per backend, so retries
// do not multiply; [Standalone] gives an unrelated inner chain its own.
//
// # Instrumentation
//
// [Chain.OnAttempt] hears every attempt as it ends; [Chain.OnAttemptStart]
// gives each request a context of its own before it is sent (a trace
// span, for the HTTP client's spans to hang under), and [Chain.WrapDo]
// runs around each Do. contrib/otelretry uses them to trace and measure a
// chain with OpenTelemetry in one call.
//
// # Secrets
//
// Everything this package renders from an error or a record passes
// through [Redact], which hides API keys, tokens and URL credentials: the
// error text and the model's raw output alike. Attempt.Err and
// Attempt.RawText themselves stay as the backend gave them.
//
// # Concurrency
//
// A Chain is immutable once built and safe for concurrent use; all of a
// call's state is its own, and Do runs its backends and OnAttempt on the
// calling goroutine. A Breaker is safe for concurrent use. A chain set up
// wrong is refused by [Chain.Validate] and Do with an [ErrConfig] error
// before any backend is called.
package llmretry
