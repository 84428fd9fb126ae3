// Package genairetry provides [llmretry] Backends for Google's Go SDK for
// Gemini (google.golang.org/genai), so that a Chain can retry Gemini
// models, fail over between them, and fail over to and from other
// providers' models, all answering with a [llmretry.Completion]:
//
//	client, err := genai.NewClient(ctx, &genai.ClientConfig{
//		APIKey:     key,
//		Backend:    genai.BackendGeminiAPI,
//		HTTPClient: &http.Client{Transport: genairetry.Transport(nil)},
//	})
//	flash := genairetry.GenerateContent(client, "gemini-2.5-flash", build)
//	flash.Retry = llmretry.Policy{Waits: []time.Duration{time.Second, 5 * time.Second}}
//	chain := &llmretry.Chain[Prompt, llmretry.Completion]{
//		Backends: []llmretry.Backend[Prompt, llmretry.Completion]{flash, fallback},
//	}
//	answer, err := chain.Do(ctx, prompt)
//
// [GenerateContent] sends one request and waits for the whole answer;
// [GenerateContentStream] streams it, and hands the text to a callback as
// it comes or holds it until it is whole. [Failure] maps the SDK's
// errors, for a Backend of your own. [Transport] lets the Backends see
// the headers of an error response, which the SDK does not pass on.
//
// # Retries and timeouts
//
// The chain owns every retry. Each Call sends exactly one HTTP request:
// for that request the SDK's retries (HTTPOptions.RetryOptions) are set
// to a single attempt, its request timeout (HTTPOptions.Timeout) to none,
// and its automatic continuation, which resends a request on its own, is
// off, whatever the client and the config say. A policy of three tries
// costs three requests, each with its record. Bound an attempt with
// Backend.Timeout and end a stream that stops sending with
// Backend.StallTimeout, not with the SDK's timeout or the http.Client's:
// an attempt that the chain's clock ends fails with its cause,
// [llmretry.ErrAttemptTimeout] or [llmretry.ErrStalled], rather than the
// SDK's bare context error, so its record says whose clock ran out.
//
// # Errors
//
// What maps to which [llmretry.Kind]:
//
//	429 RESOURCE_EXHAUSTED                  transient; RetryAfter from the RetryInfo's retryDelay
//	                                        and the Retry-After header (the longer)
//	429 RESOURCE_EXHAUSTED, a daily quota   rejected: fails over at once ([DailyQuota])
//	500 INTERNAL, 503 UNAVAILABLE,
//	504 DEADLINE_EXCEEDED                   transient
//	400 INVALID_ARGUMENT (a prompt too long
//	among them), FAILED_PRECONDITION,
//	401, 403, 404                           rejected
//	other statuses                          by [llmretry.ClassifyStatus]
//	finishReason MAX_TOKENS                 truncated, keeping the partial text
//	finishReason SAFETY, RECITATION,
//	PROHIBITED_CONTENT, BLOCKLIST, SPII,
//	IMAGE_SAFETY, IMAGE_PROHIBITED_CONTENT,
//	IMAGE_RECITATION; a prompt blocked
//	by promptFeedback.blockReason           refused ([llmretry.Refusal]), keeping the partial text
//	no text and no function call            parse (another sample may differ)
//	no finishReason; a stream cut or ended
//	before one; an undecodable body or event transient
//	refused or dropped connections          transient ([llmretry.Classify])
//
// A refusal ends the chain by default, with the provider's reason
// ("genairetry: finishReason SAFETY"), rather than taking the content to
// another provider; see Chain.FailOverRefused. A spent daily quota
// (a google.rpc.QuotaFailure whose quotaId or quotaMetric is per day) is
// rejected although Gemini sends a RetryInfo with it: the quota comes
// back the next day, so retrying within the call cannot help. An API
// error's record names Google's status name and message, with keys and
// URL secrets redacted; errors.As still finds the genai.APIError beneath
// it, in the attempt's record (Attempts[i].Err), not in the error Do
// returns.
//
// # Usage and rate limits
//
// Every answer, and every failure with a usageMetadata (a truncation, a
// refusal, a stream cut after some chunks), reports what it cost
// ([llmretry.ReportUsage]): InputTokens is promptTokenCount (with
// toolUsePromptTokenCount), OutputTokens candidatesTokenCount plus
// thoughtsTokenCount, CachedInputTokens cachedContentTokenCount and
// ReasoningTokens thoughtsTokenCount.
//
// Every Call hands the headers of the response it got to
// [llmretry.ReportLimits], for a [llmretry.Breaker] to pace by. The SDK
// gives a Backend the headers of an answer but not of an error response;
// a client built with [Transport] gives both, and with them an error's
// Retry-After. The Gemini API itself sends no rate-limit headers; a
// gateway in front of it may.
//
// Both Backends set [llmretry.Backend].Estimate, so that the Breaker
// counts a request's tokens against the tokens bucket such headers
// report from the moment the request is let through, not from the next
// report: a burst of large requests then does not overshoot a
// tokens-per-minute limit. Each estimate calls build once more. The input
// is estimated without a tokenizer, as the UTF-8 bytes of the request's
// text / 4, rounded up, plus 4 tokens a content (the system instruction
// counts as one) for its role and separators: Google puts a token at
// about four characters, and bytes keep text in other scripts from being
// counted at a quarter of a token a character. The text is the contents'
// and the system instruction's text parts (thoughts too), function calls
// and responses (name, and arguments or response as JSON), executable
// code and its results, and the tool declarations as JSON; inline data,
// files and a cachedContent are not counted. The output is
// maxOutputTokens times candidateCount, or 0 when the config sets no
// maxOutputTokens: the model's default is not known. Low or high, an
// estimate counts only until the next report says what was used.
//
// # Streaming
//
// A stream counts as an answer once a chunk carries a finishReason; one
// that is cut, or ends before that, is a transient failure whose record
// keeps the text received so far. With an emit callback, or in a call
// that streams to a consumer of its own ([llmretry.WithStream],
// [llmretry.Chain.Stream]), the text goes through [llmretry.Emit], which
// marks the attempt delivered before the first text reaches the caller,
// so a failure after that is returned at once rather than sent again or
// taken to the next backend. Otherwise the answer is held whole and each
// chunk only reports [llmretry.Progress]: a stream that
// breaks is retried or failed over, as nothing of it reached the caller.
//
// The Gemini API has no way to continue an answer from text the caller
// holds, so the Backends cannot ([llmretry.Chain].Continue passes them
// over); a chain with Restart starts such an answer again instead.
//
// # Telemetry
//
// Every Backend says who serves it in Provider: "gcp.gemini" for a client
// of the Gemini API, "gcp.vertex_ai" for one of Vertex AI.
// GenerateContentStream's sets Stream; an answer's ID is the response's
// responseId. Instrumentation such as contrib/otelretry reads them.
//
// # Concurrency
//
// The Backends keep no state between calls; they are safe for concurrent
// use as long as the build and emit functions given to them are.
package genairetry
