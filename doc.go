// Package llmretry makes calls to LLM providers survive outages. A [Chain]
// sends a request to its backends ([Backend]) in order: it sends a failed
// request again after the waits of the backend's [Policy], fails over to
// the next backend when one gives up, and, when every backend has failed,
// returns one typed error that keeps a record of every attempt and tells a
// job queue whether running the item again could help.
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
// That is Example_fallback, which runs with the tests. Each rule is stated
// once, on the identifier it governs; the sections below say where.
//
// # Failures
//
// A backend's Call says how it failed by returning a [*Failure]
// ([StatusFailure], [Truncation], [ParseFailure], [Refusal]); [Classify]
// reads any other error. The failure's [Kind] decides whether the chain
// tries the backend again, fails over or stops; a refusal stops it unless
// [Chain.FailOverRefused] is set.
//
// # Timing
//
// A backend's [Policy] holds its waits and their limits; [Backend.Timeout]
// bounds an attempt, and [Backend.StallTimeout] its time without output.
//
// # Breakers
//
// A [Breaker] is a backend's health, shared by every call that holds the
// same pointer: while it is open, calls skip the backend, and it paces the
// backend by the rate-limit headers a Call hands to [ReportLimits]. Given
// a [BreakerStore], the Breakers of a fleet of processes act as one.
//
// # Records, errors and advice
//
// Every attempt has an [Attempt] record, whose [Next] and [Why] say what
// the chain did after it, and whose [Usage] says what it cost. [Chain.Do]
// returns an [*Exhausted], a [*Truncated] or [*TimedOut] (which embed
// it), or a [*Cancelled]; errors.Is and errors.As on them answer for the
// outcome only, and each attempt's error stays in its record
// (Example_lastProviderError reaches it). The errors encode to JSON for
// dead-letter tables, which [DecodeError] reads back, and log as slog
// groups; [HTTPStatus] says what a handler should answer. [RetryItem] and
// [RetryItemAfter] say whether and when running a failed item again could
// help; the batch package runs many items by them.
//
// # Streaming and nesting
//
// A Call that streams hands its text over with [Emit] (or calls
// [Delivered]) with each chunk, and calls [Progress] with each it holds to
// answer whole: delivered output is never sent again, unless
// [Chain.Continue] lets the call go on from it, or [Chain.Restart] start
// it again. [WithStream] and [Chain.Stream] stream one call to a consumer
// of its own. A chain whose Do runs under an attempt of another chain
// makes one attempt per backend, so that retries do not multiply, when
// that attempt's backend has Waits or that chain itself makes one attempt
// per backend ([Chain.Do]); otherwise, and always under [Standalone], it
// retries by its own policies.
//
// # Instrumentation
//
// [Chain.OnAttempt], [Chain.OnAttemptStart] and [Chain.WrapDo] hook into
// each call, and [OnProgress] into its streams' progress; contrib/otelretry
// uses them to trace and measure a chain by the OpenTelemetry GenAI
// conventions.
//
// # Secrets
//
// Everything this package renders from an error or a record passes
// through [Redact].
//
// # Concurrency
//
// A Chain is immutable once built and safe for concurrent use, as is a
// Breaker; [Chain.Do] says on which goroutines a call runs. A chain set up
// wrong is refused with an [ErrConfig] error ([Chain.Validate]) before any
// backend is called.
package llmretry
