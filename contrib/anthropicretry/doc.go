// Package anthropicretry provides [llmretry] Backends for the official Go
// SDK of Anthropic's Messages API (github.com/anthropics/anthropic-sdk-go),
// so that a Chain can retry Claude models, fail over between them, and fail
// over to and from other providers' models, all answering with a
// [llmretry.Completion]:
//
//	claude := anthropicretry.Messages(client, "claude-sonnet-4-5", build)
//	claude.Retry = llmretry.Policy{Waits: []time.Duration{time.Second, 5 * time.Second}}
//	chain := &llmretry.Chain[Prompt, llmretry.Completion]{
//		Backends: []llmretry.Backend[Prompt, llmretry.Completion]{claude, fallback},
//	}
//	answer, err := chain.Do(ctx, prompt)
//
// It takes the SDK's major version 2, github.com/anthropics/anthropic-sdk-go/v2
// (an anthropic.Client of v1 is another type and does not compile here),
// and needs Go 1.25, as that SDK does:
//
//	go get github.com/llmretry/llmretry/contrib/anthropicretry
//
// [Messages] sends one request and waits for the whole answer;
// [MessagesStream] streams it and hands the text to a callback as it comes.
// [Failure] maps the SDK's errors, for a Backend of your own.
//
// # Retries and timeouts
//
// The chain owns every retry. Each Call sends exactly one HTTP request,
// with the SDK's retries turned off for that request whatever the client
// was built with, so that a policy of three tries costs three requests
// and each one has its record.
//
// Do not set the SDK's per-request timeout (option.WithRequestTimeout) for
// these Backends. Under it the SDK retries on its own (it counts a
// timed-out request as a dropped connection) and sleeps out retry-after
// hints where the chain can neither see nor cap them, and on a stream it
// cuts a healthy answer that outlasts it. Calls made by this package
// override it: a non-streaming request gets the time left before the
// attempt's deadline, a stream none. Bound an attempt with
// Backend.Timeout, and end a stream that stops sending text with
// Backend.StallTimeout. An attempt that one of them ends fails with the
// chain's cause, [llmretry.ErrAttemptTimeout] or [llmretry.ErrStalled],
// rather than the SDK's bare context error, so its record says whose
// clock ran out.
//
// The SDK refuses a non-streaming request that may run longer than ten
// minutes (a large max_tokens for the model) unless it has a request
// timeout. With a deadline on the context, or a Backend.Timeout, the
// Backend passes the time left and the request is sent; without one, the
// attempt fails at once, without a request, with a rejected configuration
// error that wraps [llmretry.ErrConfig], advises [llmretry.RetryItem]
// false and names [MessagesStream], the better choice for long answers.
// The chain then returns an [*llmretry.Exhausted]; the configuration error
// is its record's Err, not in its error tree.
//
// # Errors
//
// An API error becomes a [*llmretry.Failure] with the HTTP status, the
// server's retry-after hint and x-should-retry, and a message naming the
// provider's error type and message and the request id, with keys and
// URL secrets redacted; errors.As still finds the *anthropic.Error
// beneath it, in the attempt's record (Attempts[i].Err), not in the error
// Do returns. What each outcome maps to:
//
//	KindTransient (retried)
//	    429, 5xx, 529 overloaded; error events overloaded_error,
//	    api_error, rate_limit_error, timeout_error; a dropped or refused
//	    connection (by [llmretry.Classify]); a stream event that does
//	    not decode; a stream that stops before its stop_reason; an
//	    answer without a stop_reason
//	KindTimeout (retried)
//	    an attempt ended by Backend.Timeout or Backend.StallTimeout
//	KindRejected (fails over at once)
//	    other 4xx, among them a prompt too long for the model; any
//	    status with x-should-retry: false; 401, 403 and 404 whatever
//	    x-should-retry says; error events
//	    invalid_request_error, authentication_error, permission_error,
//	    not_found_error, billing_error; a configuration error
//	KindTruncated (fails over at once)
//	    stop_reason max_tokens or model_context_window_exceeded
//	KindRefused (ends the chain, unless Chain.FailOverRefused)
//	    stop_reason refusal, as llmretry.Refusal("stop_reason refusal")
//	KindParse (retried)
//	    an answer with neither text nor tool use
//	KindUnknown (fails over)
//	    an error event of a type not listed
//
// An error event inside a stream that began with 200 is recorded with the
// status its type stands for (529 for overloaded_error, 500 for
// api_error, 429 for rate_limit_error). A truncation ends the chain with
// a *llmretry.Truncated, a refusal with a *llmretry.Exhausted whose lever
// says running it again will not help; the records of both, like those of
// a parse failure or a broken stream, keep the text received as RawText.
//
// # Usage
//
// Every answer reports the usage the provider gave with
// [llmretry.ReportUsage], so its record's Usage holds it: InputTokens is
// the whole prompt, input_tokens plus cache_read_input_tokens plus
// cache_creation_input_tokens (Anthropic counts the cache apart), and
// CachedInputTokens the part read from the cache. A billed failure (a
// truncation, a refusal, a parse failure) carries the same in
// Failure.Usage, and a stream that breaks after message_start reports
// what it had counted by then. A request that got no usage (an error
// status, a dropped connection) has none in its record: unknown, not
// zero.
//
// # Rate limits
//
// Every Call, plain or streaming, hands the headers of the response it
// got, an answer's or an error's, to [llmretry.ReportLimits]. A
// [llmretry.Breaker] on the Backend then paces its requests by the
// provider's anthropic-ratelimit-* headers, unless its NoPacing is set: a
// call waits for the bucket to refill, or goes on to the next backend,
// instead of drawing a 429.
//
// Both Backends set [llmretry.Backend].Estimate, so that the Breaker
// counts a request's tokens against the provider's input and output
// buckets from the moment the request is let through, not from the
// provider's next report: a burst of large requests then does not
// overshoot a tokens-per-minute limit. Each estimate calls build once
// more. The input is estimated without a tokenizer, as the UTF-8 bytes of
// the request's text / 4, rounded up, plus 4 tokens a message (the system
// prompt counts as one) for its role and separators: a token is about
// four characters of English, and bytes keep text in other scripts from
// being counted at a quarter of a token a character. The text is the
// system prompt, the messages' text, thinking, tool uses (name, and input
// as JSON), tool results' text and plain-text documents, and the tool
// definitions as JSON; images, PDFs and the server tools' blocks are not
// counted. The output is max_tokens, which Anthropic, too, counts against
// the output limit when a request arrives. Low or high, an estimate
// counts only until the provider's next report says what was used.
//
// # Streaming
//
// A stream counts as an answer once its message_delta brings a
// stop_reason; the Backend does not wait for message_stop. One that is
// cut, garbled or ends cleanly before that is a transient failure whose
// record keeps the text received so far. With an emit, or in a call that
// streams to a consumer of its own ([llmretry.WithStream],
// [llmretry.Chain.Stream]), the text goes through [llmretry.Emit], which
// marks the attempt delivered before the first text reaches the caller,
// so a failure after that is returned at once rather than sent again or
// taken to the next backend. Otherwise the answer is held until it is
// whole and each event is reported with [llmretry.Progress] instead:
// Backend.StallTimeout still cuts a stream that goes quiet, and a stream
// that breaks is retried or taken to the next backend, since nobody has
// seen its text.
//
// # Continuation
//
// Both Backends can continue an answer the caller holds part of
// ([llmretry.Chain].Continue): an attempt told to ([llmretry.Continuing])
// sends the text as an assistant prefill, the conversation's last
// message, without its trailing white space, which Anthropic refuses
// there; it leaves out the white space the model's continuation begins
// with, which the caller has, hands the rest to [llmretry.Emit] and
// answers with the whole text. A model that does not take a prefill (a
// 4xx other than a 429 to the request that carried it) fails that
// attempt with [llmretry.ErrCannotContinue], and its Backend sends no
// prefill again: the chain goes on to a backend that can, or starts the
// answer again.
//
// # Telemetry
//
// Every Backend says who serves it in Provider, "anthropic" (set it to the
// service's name when the client points elsewhere, such as AWS Bedrock),
// and MessagesStream's sets Stream; an answer's ID is the message's id.
// Instrumentation such as contrib/otelretry reads them.
//
// # Concurrency
//
// The Backends keep no state between calls; they are safe for concurrent
// use as long as the build and emit functions given to them are.
package anthropicretry
