// Package otelretry provides OpenTelemetry traces and metrics for a
// [llmretry.Chain], by the OpenTelemetry semantic conventions for
// generative AI as of v1.41.0: the last release that holds them, whose Go
// package (go.opentelemetry.io/otel/semconv/v1.41.0) this one uses.
// Wiring a chain is one call, [Instrument]; the chain is built as before.
//
//	chain = otelretry.Instrument(chain, otelretry.Config{})
//	answer, err := chain.Do(ctx, req)
//
// # Spans
//
// Each Do is a client span, the logical call, which covers its retries
// and fail-overs as the conventions ask of an operation retried for the
// caller. Under it, each request sent is an inference span, client too,
// with the HTTP client's spans (otelhttp, or an SDK's middleware) under
// it, since the context a backend's Call runs under carries it. Both are
// named "{gen_ai.operation.name} {gen_ai.request.model}" ("chat gpt-4o")
// and carry the operation, gen_ai.provider.name, the model requested,
// gen_ai.request.stream when the backend streams, and server.address and
// server.port as the request's HTTP client wrote them (the Host: behind a
// proxy, the server). A request span adds its record as llmretry.*
// attributes and http.request.resend_count. The call's span starts named
// for the first backend and is named, at its end, for the backend that
// answered; the answer's gen_ai.response.id, model and finish_reasons go
// on it and on the span of the request that answered.
//
// The model requested is the backend's Model. A backend without one (an
// adapter given none sends the model its build func names) is named by
// the model that answered, or by the operation alone. The provider is
// [Config.Provider]'s answer, else the backend's own Provider (each
// adapter sets it), else [GuessProvider]'s, else "_OTHER": the conventions
// require the attribute.
//
// A skip sent nothing, so it is no inference: it is an internal span,
// "skip {model}", with its record. A retry's wait is an event on the
// request span that decided it, and a gap before the next.
//
// For a backend that is a pool ([llmretry.Backend].Pool), each request
// span says which deployment the request went to, as llmretry.deployment
// (the [llmretry.Deployment]'s Name), and why it was chosen, as
// llmretry.deployment.chosen (an [llmretry.Chosen]); a skip names the
// deployment whose breaker held the call back, chosen as the soonest. The chain names the
// deployment only in the attempt's record, so a request span starts as
// the pool's and takes the deployment's name, model, provider (the
// deployment's Provider, else the pool's, as for a backend) and
// gen_ai.request.stream when the request ends: a sampler that decides
// when a span starts sees the pool's. The call's span names the
// deployment that answered.
//
// Usage, gen_ai.usage.*, is on the request spans only, each with what the
// provider reported for it, a failed request's included: the call's span
// would count them again. The usage of a trace's spans adds up to what
// was billed, and a request whose Call runs an instrumented chain leaves
// its usage to that chain's spans.
//
// A call or request that ended in an error, cancellation included, has
// status Error, described by the error's message (its first line), an
// exception event with the error's Go type and message, and error.type:
// for a call, its outcome (exhausted, truncated, timed_out, cancelled, or
// _OTHER for a configuration error); for a request, its [llmretry.Kind]
// (transient, timeout, truncated, parse, rejected, cancelled, refused,
// unknown). A request span says what [llmretry.Chain.OnAttempt] heard:
// when the caller's cancel or deadline cuts a wait short, the request
// before it still says retry, and the call's span says how the call ended.
//
// # Metrics
//
// gen_ai.client.operation.duration (seconds) is recorded once per Do,
// charged to the provider and model that answered, or to the first
// backend's with error.type when none did; gen_ai.client.token.usage
// ({token}) once per request whose provider reported usage, a failed
// request's with llmretry.failed true. Both use the conventions' advised
// bucket boundaries and attributes. llmretry.attempts counts requests and
// skips by kind, next and why, and a pool's by llmretry.deployment too.
// For each backend with a Breaker, and each deployment of a pool,
// llmretry.breaker.state is its state as a gauge (0 closed, 1 open, 2
// half-open) and llmretry.breaker.openings how often it opened; a
// deployment's carry llmretry.deployment beside the pool's
// llmretry.backend.
//
// # Content and secrets
//
// No request, prompt or answer text is recorded unless [Config] opts in,
// and then only the answer; error messages pass through [llmretry.Redact].
//
// # Concurrency
//
// The chain [Instrument] returns is as safe for concurrent Do calls as the
// one it was given; every call's spans are its own.
package otelretry
