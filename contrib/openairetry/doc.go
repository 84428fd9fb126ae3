// Package openairetry provides [llmretry] backends for OpenAI's Chat
// Completions API, called through the official openai-go SDK, so that a
// [llmretry.Chain] can retry OpenAI and fail over to another provider:
//
//	client := openai.NewClient()
//	build := func(q string) openai.ChatCompletionNewParams {
//		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
//	}
//	gpt := openairetry.Chat(client, "gpt-4o", build)
//	gpt.Retry = llmretry.Policy{Waits: []time.Duration{time.Second, 5 * time.Second}}
//	mini := openairetry.Chat(client, "gpt-4o-mini", build)
//	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{gpt, mini}}
//	answer, err := chain.Do(ctx, "Why is the sky blue?")
//
// It takes the SDK's major version 3, github.com/openai/openai-go/v3 (an
// openai.Client of another major version is another type and does not
// compile here), and needs Go 1.26, as that SDK does:
//
//	go get github.com/llmretry/llmretry/contrib/openairetry
//
// [Chat] makes one plain request per attempt; [ChatStream] streams and
// hands the text to a callback as it arrives. Both answer with an
// [llmretry.Completion], whose Raw is the *openai.ChatCompletion, so
// backends of other providers can stand in the same chain.
//
// # Retries
//
// The chain owns every retry. Each Call turns the SDK's own retries off
// for its request (option.WithMaxRetries(0)), whatever the client was
// built with: otherwise every attempt the chain records would be up to
// three requests, the SDK's waits would hide the server's retry-after
// from the chain, and a provider that is down would cost three times the
// requests the policy allows.
//
// # Errors
//
// A failed Call returns what [Failure] makes of the SDK's error: an API
// error becomes an [*llmretry.Failure] with the HTTP status, the
// retry-after hint and the provider's error type, code, message and
// request id in its message, with any key the provider quotes back
// redacted; a 429 whose code is insufficient_quota is
// rejected rather than transient; transport errors are left for
// [llmretry.Classify]. Answers that cannot be used fail too: a
// finish_reason of "length" with [llmretry.Truncation] and the partial
// text, an answer with no text and no tool call with
// [llmretry.ParseFailure]. errors.As finds the *openai.Error beneath the
// Failure, which the chain keeps as the attempt's record (Attempts[i].Err),
// not in the error Do returns.
//
// # Rate limits
//
// Every Call, plain or streaming, hands the headers of the response it
// got, an answer's or an error's, to [llmretry.ReportLimits]. A
// [llmretry.Breaker] on the Backend then paces its requests by the
// provider's x-ratelimit-* headers, unless its NoPacing is set: a call
// waits for the bucket to refill, or goes on to the next backend, instead
// of drawing a 429.
//
// # Timing
//
// Do not give the client a request timeout (option.WithRequestTimeout):
// the SDK would end an attempt on its own clock, where the chain cannot
// tell it from any other timeout, and for a stream it bounds the whole
// answer, so a healthy stream that is still sending is cut and, with text
// delivered, cannot be retried. Set Timeout on the returned Backend to
// bound each attempt, and, for [ChatStream], StallTimeout to bound the
// silence before the first piece of text and between later ones. An
// attempt that one of them ends fails with the chain's cause,
// [llmretry.ErrAttemptTimeout] or [llmretry.ErrStalled], rather than the
// SDK's bare context error, so its record says whose clock ran out.
//
// # Concurrency
//
// The returned Backends hold no state between calls and are safe for
// concurrent use, as openai.Client is. build and emit are called on the
// goroutine that runs the attempt, so a chain running Do concurrently
// calls them concurrently.
package openairetry
