// Package openairetry provides [llmretry] backends for OpenAI's Chat
// Completions and Responses APIs, called through the official openai-go
// SDK, so that a [llmretry.Chain] can retry OpenAI and fail over to
// another provider:
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
// [Chat] and [Responses] make one plain request per attempt;
// [ChatStream] and [ResponsesStream] stream it. All four answer with an
// [llmretry.Completion], whose Raw is the *openai.ChatCompletion or the
// *responses.Response, so backends of other providers can stand in the
// same chain.
//
// A streaming backend reports [llmretry.Progress] for every event it
// reads, text or not, so StallTimeout cuts a stream that falls silent and
// never one that is busy, with a tool call say. With an emit, or in a
// call that streams to a consumer of its own ([llmretry.WithStream],
// [llmretry.Chain.Stream]), it hands the text over as it arrives through
// [llmretry.Emit], which marks the attempt delivered: a failure after
// that is returned at once, never sent again, since the caller holds part
// of the answer. Otherwise it holds the answer and returns it whole, and
// a stream that breaks is sent again or to the next backend, as a plain
// request is. Use that for a gateway that answers only once the answer
// is whole, or a batch job that streams only so that a stall can be cut.
//
// # Continuation
//
// A chain that continues an answer cut after text reached the caller
// ([llmretry.Chain].Continue) needs backends that can. OpenAI's Chat
// Completions API cannot; [WithPrefix] makes a Chat or ChatStream
// Backend continue on a server that can, by a prefix ([PrefixFlag] for
// DeepSeek and Mistral, [ContinueFinalMessage] for vLLM and SGLang) or
// by replaying the request to a server that answers it the same way
// ([Replay]). [WithBackground] runs ResponsesStream's requests in the
// background, so that its own next attempt resumes the response's stream
// after the last event read. A continued answer is returned whole; only
// what follows the caller's text is handed over.
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
// A failed Call returns what [Failure] makes of the SDK's error, or what
// the answer stands for. What maps to which Kind:
//
//   - [llmretry.KindTransient], retried: a 408, 425, 429 or 5xx (a 529
//     too), with its retry-after; an error event of type server_error,
//     api_error, overloaded_error or rate_limit_error inside a stream; a
//     Responses API response failed or an error event with code
//     server_error, vector_store_timeout or rate_limit_exceeded; a
//     connection refused, reset or cut; a body or event that does not
//     decode; a stream that ends before its finish reason, or before
//     response.completed; a response still queued or in progress.
//   - [llmretry.KindRejected], not retried, failed over: any other 4xx
//     (context_length_exceeded among them), a 429 with code
//     insufficient_quota, an in-stream invalid_request_error, and a failed
//     response whose code names bad input (invalid_prompt, invalid_image
//     ...). x-should-retry overrides the status either way.
//   - [llmretry.KindRefused], ending the chain unless
//     [llmretry.Chain].FailOverRefused is set: finish_reason
//     "content_filter", a response incomplete with reason
//     "content_filter", an error code content_policy_violation or
//     content_filter (Azure OpenAI's 400 for a filtered prompt), and a
//     failed response whose code names a policy (bio_policy,
//     image_content_policy_violation ...). The text written before the
//     filter stopped it is kept as raw text.
//   - [llmretry.KindTruncated]: finish_reason "length", or a response
//     incomplete with reason "max_output_tokens", with the partial text.
//   - [llmretry.KindParse], retried: an answer with neither text nor a
//     tool call; when the model refused (a message's refusal, a
//     response's refusal part), the refusal's text is kept as raw text.
//   - [llmretry.KindTimeout]: the backend's Timeout or StallTimeout.
//
// API errors carry the HTTP status, the provider's error type, code,
// message and request id in their message, with any key the provider
// quotes back redacted; transport errors are left for
// [llmretry.Classify]. errors.As finds the *openai.Error beneath the
// Failure, which the chain keeps as the attempt's record
// (Attempts[i].Err), not in the error Do returns.
//
// # Usage
//
// Every answer reports its token usage with [llmretry.ReportUsage], and a
// truncated, refused or empty answer carries it as its Failure's Usage,
// since the provider bills them: prompt_tokens (input_tokens for the
// Responses API) with their cached_tokens, and completion_tokens
// (output_tokens) with their reasoning_tokens. A failure that comes
// before the provider reported any has none: its cost is unknown.
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
// Every Backend sets [llmretry.Backend].Estimate, so that the Breaker
// counts a request's tokens against the provider's tokens bucket from the
// moment the request is let through, not from the provider's next report:
// a burst of large requests then does not overshoot a tokens-per-minute
// limit. Each estimate calls build once more. The input is estimated
// without a tokenizer, as the UTF-8 bytes of the request's text / 4,
// rounded up, plus 4 tokens a message for its role and separators: a
// token is about four characters of English, and bytes keep text in other
// scripts from being counted at a quarter of a token a character. The
// text and the output budget are:
//
//   - [Chat], [ChatStream]: the messages' content strings and text parts,
//     refusals, and tool calls' names and arguments, and the tool
//     definitions as JSON; the output is max_completion_tokens, else
//     max_tokens, times n.
//   - [Responses], [ResponsesStream]: the instructions and the input
//     string, each a message, and each input item, a message, with its
//     text (a message's text and refusal parts, a function or custom tool
//     call's name and arguments and its output's text, a reasoning
//     summary), and the tool definitions as JSON; the output is
//     max_output_tokens.
//
// Images, audio, files, built-in tools' items, and what a
// previous_response_id, a conversation or a prompt template bring in are
// not counted. A request that sets no output budget is estimated at 0
// output tokens: the model's default is not known. Low or high, an
// estimate counts only until the provider's next report says what was
// used.
//
// # Timing
//
// Do not give the client a request timeout (option.WithRequestTimeout):
// the SDK would end an attempt on its own clock, where the chain cannot
// tell it from any other timeout, and for a stream it bounds the whole
// answer, so a healthy stream that is still sending is cut and, with text
// delivered, cannot be retried. Set Timeout on the returned Backend to
// bound each attempt, and, for [ChatStream] and [ResponsesStream],
// StallTimeout to bound the silence before the first event and between
// any two. An
// attempt that one of them ends fails with the chain's cause,
// [llmretry.ErrAttemptTimeout] or [llmretry.ErrStalled], rather than the
// SDK's bare context error, so its record says whose clock ran out.
//
// # Telemetry
//
// Every Backend says who serves it in Provider, "openai" (set it to the
// service's name when the client points elsewhere, such as Azure OpenAI),
// and a streaming one sets Stream; an answer's ID is the completion's or
// the response's id. Instrumentation such as contrib/otelretry reads them.
//
// # Concurrency
//
// The returned Backends hold no state between calls and are safe for
// concurrent use, as openai.Client is. build and emit are called on the
// goroutine that runs the attempt, so a chain running Do concurrently
// calls them concurrently.
package openairetry
