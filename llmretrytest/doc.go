// Package llmretrytest provides a scripted LLM provider for tests, in the
// spirit of net/http/httptest: a real HTTP server on 127.0.0.1 that speaks
// enough of OpenAI Chat Completions and Responses, Anthropic Messages and
// the Gemini API, JSON and streaming, for the official Go SDKs (openai-go,
// anthropic-sdk-go, google.golang.org/genai) and plain net/http clients
// to work against it unmodified. Import it in your own tests to see how
// your code, and a [github.com/llmretry/llmretry] Chain around it, behaves when a provider fails: rate limits with
// retry-after, 5xx, overloads inside a 200 stream, truncated answers,
// streams that drop, stall or end without finishing, outages where
// connections are refused, and hostile servers that send too much, too
// slowly, or nothing at all.
//
//	srv := llmretrytest.NewServer()
//	defer srv.Close()
//	srv.Script("gpt-4o",
//		llmretrytest.Status(429).WithHeader("retry-after-ms", "20"),
//		llmretrytest.Answer("Paris is the capital of France."),
//	)
//	client := openai.NewClient(option.WithBaseURL(srv.OpenAIBaseURL()), option.WithAPIKey("test"))
//
// # Scripts
//
// Each request plays the next [Step] of the script of the model its body
// names ([Server.Script]); when the script runs out, its last step
// repeats, so a one-step script plays forever. A model with no script gets
// a 404 in the provider's shape. Every request the server reads is logged
// ([Server.Requests]) with its model, API, whether it asked for a stream,
// when it arrived, its number for that model, the step it played, its
// header and the usage the response told the client, so a test can
// compare what its client recorded with what the provider saw, request for
// request, and what the requests cost.
//
// # Endpoints
//
// POST /v1/chat/completions speaks OpenAI (base URL [Server.OpenAIBaseURL])
// and POST /v1/messages Anthropic ([Server.AnthropicBaseURL]). A request
// with "stream": true gets a server-sent-event stream as the provider
// sends it: for OpenAI a role-only first chunk, one chunk per word, a
// chunk with finish_reason, a usage chunk when stream_options.include_usage
// is set, then data: [DONE]; for Anthropic message_start, ping,
// content_block_start, one content_block_delta per word,
// content_block_stop, message_delta with stop_reason and usage, then
// message_stop. Every response carries a request id, "req_<model>_<N>",
// in x-request-id (OpenAI) or request-id (Anthropic). Answers report 10
// input tokens and one output token per word (Anthropic's message_start
// says 1 output token, as Anthropic's does, until message_delta gives the
// count).
//
// POST /v1/responses speaks OpenAI's Responses API, at the same base URL
// and with the same errors and headers as Chat Completions, logged with
// API "openai-responses": an answer is a response object whose status
// says how it ended, and a stream runs from response.created through one
// response.output_text.delta per word to response.completed,
// response.incomplete or response.failed, with no [DONE]. The same steps
// script it; [Failed] plays the failed response only it has.
//
// POST /v1beta/models/{model}:generateContent speaks the Gemini API
// ([Server.GeminiBaseURL], for google.golang.org/genai), with the model
// named by the path, and :streamGenerateContent?alt=sse streams it: one
// data event per word, each a whole response with the usageMetadata so
// far, the last one with its finishReason (STOP, MAX_TOKENS for
// [Truncated], SAFETY for [Refuse]) and no end sentinel. Its errors are
// Google's, {"error":{"code","message","status","details"}}: a 429 is
// RESOURCE_EXHAUSTED with a google.rpc.QuotaFailure, per minute, or per
// day for [InsufficientQuota], and with a google.rpc.RetryInfo for
// [RetryDelay]; a [StreamError] takes a Google status name such as
// "UNAVAILABLE" and sends the error as a data event. Responses carry the
// request id in x-request-id, and no rate-limit headers, as Gemini sends
// none.
//
// A body that is not JSON, or names no model, gets a 400 in the
// provider's shape, one over 10 MiB a 413; both are logged with Model "".
//
// The server closes each connection after its response (Connection:
// close), so every request comes on a fresh connection. That keeps
// failures exact: after [Down] or [Server.GoDown] every request is
// refused, even from a client that pools connections, and a client never
// resends on a reused connection that a [Hangup] closed, so the log holds
// exactly the requests the client made.
//
// Both SDKs retry on their own, twice by default, and every request they
// send plays a step: build clients with option.WithMaxRetries(0) when a
// test counts requests or expects a step to reach the code under test.
//
// # Continuation
//
// The server continues an answer as providers do: an Anthropic request
// whose last message is the assistant's (a prefill; one that ends with
// white space gets Anthropic's 400), and a Chat Completions request whose
// last, assistant message has "prefix": true or comes with
// "continue_final_message": true, play the next step of the script as
// the rest of its answer, after the text given, which [Request].Continues
// logs; an answer that does not begin with that text gets a 400. A
// Responses API stream asked for in the background is kept, and GET
// /v1/responses/{id}?starting_after=N resumes it: logged as a request of
// its model, it plays that model's next step, streaming the rest of the
// kept response. [Step.DropAfter], [Step.StallAfter], [Step.GarbleAfter]
// and [Step.FailAfter] break an answer partway, counting the chunks the
// request sends, so that a script of one answer broken and then whole
// tests a client that continues it.
//
// # Checking a backend
//
// [TestBackend] is a conformance suite for any backend that speaks one of
// the server's APIs, as testing/fstest.TestFS is for a file system: it
// plays every fault against the backend in a chain and checks the
// records against the log. The adapters under contrib/ run it for each of
// their backends; run it for one of your own. [CheckLog] is its check
// that a chain's records and the server's log agree, for tests of your
// own scripts.
//
// # Rate limits
//
// [Server.Limit] puts a model behind a provider's rate limits: a
// [Bucket] of requests and one of tokens, which refuse a request they
// cannot pay for with a 429 and Retry-After, and report how they stand
// on every response, in the OpenAI or Anthropic rate-limit headers as
// each provider documents them. Use it to test code that paces its
// requests by those headers.
//
// # Timing
//
// [Step.After] delays a response and [Step.Every] spaces a stream's
// chunks, of text or of a [ToolCall]'s arguments, which come in events
// that carry no text: a stream that is busy without delivering any. Delays and stalls ([StallHeaders], [StreamStall],
// [PartialHeaders]) and bodies that never end ([EndlessBody], [Trickle])
// end when the client goes away (cancels its request or closes the
// connection) or when the server is closed; the connection is then cut
// without the rest of the response.
//
// # Hostile servers
//
// Some steps test that a client bounds what it accepts. [HugeBody] is an
// answer of any size, a gigabyte or more, made as it is sent, so only the
// client can run out of memory; [EndlessBody] never ends; [Trickle] sends
// one byte an interval, keeping the connection busy while no stream event
// ever completes; [PartialHeaders] stops halfway through a header line.
// Retry-after values a server should never send, such as "-1", "1e18" or
// a date in the year 9999, need no step of their own: send them with
// [Step.WithHeader]. A [Blackhole] stands for a host that accepts
// connections and then never reads or answers. [Server.Conns] counts the
// connections the server holds open, so a test can check that its client
// let go of each one it gave up on.
//
// # Concurrency
//
// A Server serves requests concurrently, and its methods are safe for
// concurrent use while it does. Each model's steps are handed out in the
// order the server reads the requests. [Server.Close] ends every stall and
// returns only when every handler and connection goroutine is done.
package llmretrytest
