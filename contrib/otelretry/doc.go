// Package otelretry provides OpenTelemetry traces and metrics for a
// [llmretry.Chain]: one span per call with a span per attempt under it,
// and the GenAI client metrics, by the OpenTelemetry GenAI semantic
// conventions. Wiring a chain is one call, [Instrument]; the chain is
// built as before.
//
//	chain = otelretry.Instrument(chain, otelretry.Config{})
//	answer, err := chain.Do(ctx, req)
//
// # Spans
//
// Each Do is a client span named "{operation} {model}" ("chat gpt-4o",
// the first backend's model) with gen_ai.operation.name,
// gen_ai.provider.name and gen_ai.request.model; when it answers,
// gen_ai.response.model, gen_ai.usage.input_tokens and output_tokens, and
// gen_ai.response.finish_reasons; when it fails, error.type set to the
// outcome (exhausted, truncated, timed_out or cancelled) and the status
// error, except for cancelled: the caller's own withdrawal is not a
// failure of the call.
//
// Under it, every attempt is a span, skips included (they are short and
// say why), with the attempt's record as llmretry.* attributes,
// http.request.resend_count and the usage the provider reported. The
// context a backend's Call runs under carries its attempt's span, so the
// spans an HTTP client makes there (otelhttp, or an SDK's own middleware)
// are its children. A retry's wait is an event on the attempt span that
// decided it, and a gap before the next. An attempt span says what
// [llmretry.Chain.OnAttempt] heard: when the caller's cancel or deadline
// cuts a wait short, the attempt before it still says retry, and the call
// span says how the call ended.
//
// # Metrics
//
// gen_ai.client.operation.duration is recorded once per Do, and
// gen_ai.client.token.usage once per attempt that reported usage, so
// retries neither count as operations nor hide what they cost: a failed
// attempt's usage carries llmretry.failed true. llmretry.attempts counts
// attempts by kind, next and why. For each backend with a Breaker,
// llmretry.breaker.state is its state as a gauge (0 closed, 1 open, 2
// half-open) and llmretry.breaker.openings how often it opened.
//
// # Content and secrets
//
// No request, prompt or answer text is recorded unless [Config] opts in,
// and then only the answer; error messages pass through
// [llmretry.Redact].
//
// # Concurrency
//
// The chain [Instrument] returns is as safe for concurrent Do calls as the
// one it was given; every call's spans are its own.
package otelretry
