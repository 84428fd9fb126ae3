package llmretrytest

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// stepKind says what a Step plays. The zero kind is an answer, so the zero
// Step is Answer("").
type stepKind uint8

const (
	kindAnswer stepKind = iota
	kindTruncated
	kindStatus
	kindInsufficientQuota
	kindContextLength
	kindContentFilter
	kindFailed
	kindStreamError
	kindStreamDrop
	kindStreamUnfinished
	kindStreamStall
	kindStallHeaders
	kindMalformed
	kindHangup
	kindDown
	kindHugeBody
	kindEndlessBody
	kindTrickle
	kindPartialHeaders
	kindRefused
	kindToolCall
)

// Step is one scripted response: what the server does with one request.
// Build Steps with [Answer], [Status], [StreamDrop] and the other
// constructors, and adjust them with [Step.WithHeader], [Step.After] and
// [Step.Every]. A Step is a value: those methods return a changed copy and
// never alter the receiver, so one Step may be used in many scripts and by
// many goroutines. The zero Step is Answer("").
type Step struct {
	// cached and reasoning are the usage details WithUsageDetails sets.
	cached, reasoning int64

	kind    stepKind
	text    string      // Answer, Truncated, Refuse; ToolCall's arguments
	tool    string      // ToolCall's tool name
	status  int         // Status
	chunks  int         // StreamDrop, StreamUnfinished, StreamStall
	errType string      // StreamError; for Status, the bucket that refused a request (Limit)
	size    int64       // HugeBody
	headers [][2]string // WithHeader, in the order given
	after   time.Duration
	every   time.Duration
	delay   time.Duration // RetryDelay

	// How an answer breaks partway (DropAfter, StallAfter, GarbleAfter,
	// FailAfter): after faultAt chunks of its text, as faultType says.
	fault     faultKind
	faultAt   int
	faultType string
}

// String names the step as the server's log records it in [Request].Step:
//
//	Answer(text)             "answer"
//	Truncated(text)          "truncated"
//	Refuse(text)             "refused"
//	ToolCall(name, args)     "tool call name"
//	Status(503)              "status 503"
//	InsufficientQuota()      "status 429 insufficient_quota"
//	RetryDelay(time.Second)  "status 429 retry_delay"
//	ContextLengthExceeded()  "status 400 context_length_exceeded"
//	ContentFilter()          "status 400 content_filter"
//	Failed("server_error")   "failed server_error"
//	StreamError("api_error") "stream error api_error"
//	StreamDrop(2)            "stream drop 2"
//	StreamUnfinished(2)      "stream unfinished 2"
//	StreamStall(2)           "stream stall 2"
//	StallHeaders()           "stall headers"
//	Malformed()              "malformed"
//	Hangup()                 "hangup"
//	Down()                   "down"
//	HugeBody(1 << 30)        "huge body 1073741824"
//	EndlessBody()            "endless body"
//	Trickle(time.Second)     "trickle"
//	PartialHeaders()         "partial headers"
//
//	Answer(text).DropAfter(3)          "answer drop after 3"
//	Answer(text).StallAfter(3)         "answer stall after 3"
//	Answer(text).GarbleAfter(3)        "answer garble after 3"
//	Answer(text).FailAfter(3, "x")     "answer error x after 3"
//
// Headers and delays are not part of the name, so a log compares equal
// whatever the timing of a script.
func (s Step) String() string {
	if s.fault != noFault {
		return s.plain().String() + " " + s.fault.name(s.faultType) + " after " + strconv.Itoa(s.faultAt)
	}
	switch s.kind {
	case kindAnswer:
		return "answer"
	case kindTruncated:
		return "truncated"
	case kindRefused:
		return "refused"
	case kindToolCall:
		return "tool call " + s.tool
	case kindStatus:
		if s.errType != "" { // a refusal by the model's limits: "requests" or "tokens"
			return statusName(s.status) + " " + s.errType
		}
		return statusName(s.status)
	case kindInsufficientQuota:
		return statusName(429) + " insufficient_quota"
	case kindContextLength:
		return statusName(400) + " context_length_exceeded"
	case kindContentFilter:
		return statusName(400) + " content_filter"
	case kindFailed:
		return "failed " + s.errType
	case kindStreamError:
		return "stream error " + s.errType
	case kindStreamDrop:
		return "stream drop " + strconv.Itoa(s.chunks)
	case kindStreamUnfinished:
		return "stream unfinished " + strconv.Itoa(s.chunks)
	case kindStreamStall:
		return "stream stall " + strconv.Itoa(s.chunks)
	case kindStallHeaders:
		return "stall headers"
	case kindMalformed:
		return "malformed"
	case kindHangup:
		return "hangup"
	case kindDown:
		return "down"
	case kindHugeBody:
		return "huge body " + strconv.FormatInt(s.size, 10)
	case kindEndlessBody:
		return "endless body"
	case kindTrickle:
		return "trickle"
	case kindPartialHeaders:
		return "partial headers"
	}
	return "step(" + strconv.Itoa(int(s.kind)) + ")"
}

// statusName is how the log names an HTTP error response, scripted or not
// (an unknown model's 404, a malformed request's 400).
func statusName(code int) string { return "status " + strconv.Itoa(code) }

// Answer is a complete answer with text, status 200. OpenAI's
// finish_reason is "stop" and Anthropic's stop_reason "end_turn". A stream
// sends the text split into chunks, one word each with the spaces after it
// kept, so the chunks join back into text exactly. Usage counts one output
// token per chunk. Answer("") is an answer with no text: an empty content
// for OpenAI, no content block for Anthropic.
func Answer(text string) Step { return Step{kind: kindAnswer, text: text} }

// Truncated is an answer cut off at its token budget: as [Answer], but
// with OpenAI's finish_reason "length" and Anthropic's stop_reason
// "max_tokens".
func Truncated(text string) Step { return Step{kind: kindTruncated, text: text} }

// Refuse is an answer the model stopped because it refused the content:
// as [Answer], with text the words it wrote before it stopped ("" for
// none), but with Anthropic's stop_reason "refusal" and OpenAI's
// finish_reason "content_filter". Both providers answer a refusal with
// status 200 and usage, as they do an answer.
func Refuse(text string) Step { return Step{kind: kindRefused, text: text} }

// ToolCall is a complete answer that calls the caller's tool name with
// arguments, a JSON object in text, and has no text: status 200, OpenAI's
// finish_reason "tool_calls" with one function tool call (id
// "call_<model>_<N>"), the Responses API's completed response with one
// function_call item (call_id "call_<model>_<N>"), Anthropic's stop_reason
// "tool_use" with one tool_use block (id "toolu_<model>_<N>"), and
// Gemini's finishReason STOP with one functionCall part. A stream sends
// the arguments split into chunks as [Answer] splits its text, with no
// text at all: OpenAI's tool_calls deltas, the Responses API's
// response.output_item.added, one response.function_call_arguments.delta
// per chunk, response.function_call_arguments.done and
// response.output_item.done, Anthropic's tool_use content block with one
// input_json_delta per chunk; Gemini, which sends a function call whole,
// sends it in one event with its finishReason. [Step.Every] spaces the
// argument chunks. Usage counts one output token per chunk. ToolCall
// panics if name is empty or arguments is not a JSON object.
func ToolCall(name, arguments string) Step {
	if name == "" {
		panic("llmretrytest: ToolCall with an empty tool name")
	}
	if !json.Valid([]byte(arguments)) || !strings.HasPrefix(strings.TrimSpace(arguments), "{") {
		panic("llmretrytest: ToolCall(" + strconv.Quote(name) + ", " + strconv.Quote(arguments) + "): want the arguments as a JSON object")
	}
	return Step{kind: kindToolCall, tool: name, text: arguments}
}

// Status is an HTTP error response with code and the provider's error
// body for it. OpenAI's body is {"error":{"message","type","param","code"}},
// with type "invalid_request_error" for a 4xx ("requests" and code
// "rate_limit_exceeded" for a 429, code "model_not_found" for a 404,
// "invalid_api_key" for a 401) and "server_error" for a 5xx. Anthropic's is
// {"type":"error","error":{"type","message"}}, with type
// invalid_request_error (400 and any 4xx not named here),
// authentication_error (401), permission_error (403), not_found_error
// (404), request_too_large (413), rate_limit_error (429),
// overloaded_error (529) and api_error (500, 503 and any other 5xx).
// Add headers such as retry-after with [Step.WithHeader]. Status panics
// unless 400 <= code <= 599.
func Status(code int) Step {
	if code < 400 || code > 599 {
		panic("llmretrytest: Status(" + strconv.Itoa(code) + "): want an error status, 400 to 599")
	}
	return Step{kind: kindStatus, status: code}
}

// InsufficientQuota is OpenAI's 429 for an account out of credit: type and
// code "insufficient_quota", which no wait cures. Anthropic has no such
// answer and gets a plain 429 rate_limit_error. Gemini's is its spent
// daily quota: a 429 RESOURCE_EXHAUSTED whose QuotaFailure names a quota
// per day, with a RetryInfo of 43s all the same.
func InsufficientQuota() Step { return Step{kind: kindInsufficientQuota} }

// ContextLengthExceeded is a 400 for a prompt longer than the model's
// context window: OpenAI's code "context_length_exceeded" (param
// "messages"), Anthropic's invalid_request_error "prompt is too long",
// Gemini's INVALID_ARGUMENT "The input token count ... exceeds".
func ContextLengthExceeded() Step { return Step{kind: kindContextLength} }

// ContentFilter is a 400 for a prompt the provider's content filter
// blocked, as Azure OpenAI sends it: type "invalid_request_error", code
// "content_filter", param "prompt". Anthropic has no such answer and gets
// a plain 400 invalid_request_error.
func ContentFilter() Step { return Step{kind: kindContentFilter} }

// Failed is an answer the model failed partway with an error of code
// (such as "server_error" or "rate_limit_exceeded"), as the Responses API
// reports it: status 200 and a response whose status is "failed" and
// whose error has that code, in a stream the response.failed event after
// response.created. The Chat Completions and Anthropic endpoints, which
// have no failed answer, play it as [StreamError](code).
func Failed(code string) Step { return Step{kind: kindFailed, errType: code} }

// StreamError is a 200 stream that opens (OpenAI's role chunk, Anthropic's
// message_start) and then reports an error of errType in the stream, as
// providers do when they fail after the status line has gone:
// OpenAI's data: {"error":{"message","type":errType,"param":null,"code":null}},
// Anthropic's event: error with {"type":"error","error":{"type":errType,"message"}}.
// The body then ends. A request that did not ask for a stream gets the
// HTTP error that errType stands for instead: 529 for overloaded_error,
// 429 for rate_limit_error, insufficient_quota and requests, 400 for
// invalid_request_error, 401 for authentication_error, 403 for
// permission_error, 404 for not_found_error, 413 for request_too_large,
// and 500 for anything else. For Gemini, errType is a Google status name:
// its stream sends data: {"error":{"code","message","status":errType}} as
// its first event, and the HTTP error is 503 for UNAVAILABLE, 429 for
// RESOURCE_EXHAUSTED, 400 for INVALID_ARGUMENT and FAILED_PRECONDITION.
func StreamError(errType string) Step { return Step{kind: kindStreamError, errType: errType} }

// StreamDrop is a 200 stream that sends chunks text chunks and then cuts
// the connection, so the client's read fails with an unexpected EOF. Chunk
// i (from 1) is "chunk<i> ", as in "chunk1 chunk2 ". A request that did
// not ask for a stream gets a 200 whose JSON body is cut off halfway by the
// same drop. StreamDrop panics if chunks is negative.
func StreamDrop(chunks int) Step {
	return Step{kind: kindStreamDrop, chunks: checkChunks("StreamDrop", chunks)}
}

// StreamUnfinished is a 200 stream that sends chunks text chunks (as
// [StreamDrop] names them) and then ends the body cleanly without the
// terminal events: no finish_reason, usage chunk or [DONE] for OpenAI; no
// content_block_stop, message_delta or message_stop for Anthropic. A
// request that did not ask for a stream gets a complete JSON answer with
// that text and a null finish_reason / stop_reason. StreamUnfinished
// panics if chunks is negative.
func StreamUnfinished(chunks int) Step {
	return Step{kind: kindStreamUnfinished, chunks: checkChunks("StreamUnfinished", chunks)}
}

// StreamStall is a 200 stream that sends chunks text chunks (as
// [StreamDrop] names them) and then nothing, until the client goes away
// or the server is closed; then the connection is cut. A request that did
// not ask for a stream gets the status line and headers of a JSON answer
// and then the same stall. StreamStall panics if chunks is negative.
func StreamStall(chunks int) Step {
	return Step{kind: kindStreamStall, chunks: checkChunks("StreamStall", chunks)}
}

func checkChunks(name string, chunks int) int {
	if chunks < 0 {
		panic("llmretrytest: " + name + "(" + strconv.Itoa(chunks) + "): negative chunk count")
	}
	return chunks
}

// StallHeaders sends nothing at all, not even a status line, until the
// client goes away or the server is closed; then the connection is closed
// without a response.
func StallHeaders() Step { return Step{kind: kindStallHeaders} }

// Malformed is a 200 whose body cannot be decoded: truncated JSON with
// content type application/json, or for a stream one SSE event whose data
// is truncated JSON, after which the body ends.
func Malformed() Step { return Step{kind: kindMalformed} }

// Hangup closes the connection before any response, so the client's
// request fails with io.EOF.
func Hangup() Step { return Step{kind: kindHangup} }

// Down closes the connection without a response and takes the whole
// server down, as [Server.GoDown] does: later connections are refused
// (ECONNREFUSED), for every model. With [Step.After], the server goes
// down when the wait ends, even when the client gave up waiting.
func Down() Step { return Step{kind: kindDown} }

// HugeBody is a 200 answer whose text is n bytes of the letter x: the
// provider's JSON answer (Content-Length set to the body's size), or for a
// stream its usual events with the whole text in one chunk, so one SSE
// data line longer than n. The body is made while it is sent, in blocks
// of 32 KiB, so the server holds no more of it than one block however
// large n is; a client that reads it whole holds it all. With
// [Step.Every] the blocks are spaced d apart. HugeBody panics if n is
// negative.
func HugeBody(n int64) Step {
	if n < 0 {
		panic("llmretrytest: HugeBody(" + strconv.FormatInt(n, 10) + "): negative size")
	}
	return Step{kind: kindHugeBody, size: n}
}

// EndlessBody is a 200 answer whose text never ends: it starts as
// [HugeBody] does, and then sends x in blocks of 32 KiB, as fast as the
// client reads, until the client goes away or the server is closed. For a
// stream, the chunk that holds the text is one SSE data line that never
// ends. With [Step.Every] the blocks are spaced d apart: a slow endless
// body that a client's size limit takes long to reach.
func EndlessBody() Step { return Step{kind: kindEndlessBody} }

// Trickle is a 200 answer that starts as [EndlessBody] does and then
// sends one byte, an x of the answer's text, every interval, until the
// client goes away or the server is closed. For a stream, the bytes
// extend one SSE data line that never ends, so no chunk beyond the
// opening ones is ever complete: the connection is busy, but the client
// has nothing to hand over. Trickle panics unless every is positive.
func Trickle(every time.Duration) Step {
	if every <= 0 {
		panic("llmretrytest: Trickle(" + every.String() + "): want a positive interval")
	}
	return Step{kind: kindTrickle, every: every}
}

// PartialHeaders sends the status line and half a header line,
// "HTTP/1.1 200 OK\r\nContent-Type: applic", and then nothing, until the
// client goes away or the server is closed; then the connection is
// closed. Unlike [StallHeaders], the client has begun reading a response
// and waits in the middle of its headers.
func PartialHeaders() Step { return Step{kind: kindPartialHeaders} }

// WithHeader returns a copy of s that sends the response header key with
// value. Headers named in several calls are sent with every value, in
// order, and replace the server's own value for that key (content-type,
// x-request-id, request-id). Use it for retry-after, retry-after-ms and
// x-should-retry. It has no effect on steps that send no response
// ([Hangup], [Down], [StallHeaders], [PartialHeaders]).
func (s Step) WithHeader(key, value string) Step {
	s.headers = append(slices.Clip(s.headers), [2]string{key, value})
	return s
}

// WithUsageDetails returns a copy of s whose answer's usage reports, of
// its input tokens, cached read from the provider's cache, and, of its
// output tokens, reasoning spent on reasoning: OpenAI's
// prompt_tokens_details.cached_tokens and
// completion_tokens_details.reasoning_tokens, and the Responses API's
// input_tokens_details.cached_tokens and
// output_tokens_details.reasoning_tokens; Gemini's
// cachedContentTokenCount and thoughtsTokenCount (which Gemini counts
// apart from candidatesTokenCount). Without it both are 0. The
// Anthropic endpoint ignores them.
func (s Step) WithUsageDetails(cached, reasoning int64) Step {
	s.cached, s.reasoning = cached, reasoning
	return s
}

// After returns a copy of s that waits d before responding. The wait ends
// early, and the connection is then cut, when the client goes away or the
// server is closed. A zero or negative d means no wait.
func (s Step) After(d time.Duration) Step {
	s.after = d
	return s
}

// Every returns a copy of s that, in a stream, waits d between one text
// chunk and the next. A wait ends early, and the connection is then cut,
// when the client goes away or the server is closed. It has no effect on a
// request that did not ask for a stream, except for the steps that send a
// body by the block: [HugeBody] and [EndlessBody] wait d between blocks,
// stream or not, and [Trickle] sends its byte every d. A zero or negative
// d means no wait (for Trickle: a byte as fast as the client reads).
func (s Step) Every(d time.Duration) Step {
	s.every = d
	return s
}

// textChunks is the text a step streams, one chunk per element.
func (s Step) textChunks() []string {
	switch s.kind {
	case kindAnswer, kindTruncated, kindRefused:
		return splitWords(s.text)
	case kindStreamDrop, kindStreamUnfinished, kindStreamStall:
		chunks := make([]string, s.chunks)
		for i := range chunks {
			chunks[i] = "chunk" + strconv.Itoa(i+1) + " "
		}
		return chunks
	}
	return nil
}

// argChunks is the tool call's arguments a step streams, one chunk per
// element; none for a step that calls no tool.
func (s Step) argChunks() []string {
	if s.kind != kindToolCall {
		return nil
	}
	return splitWords(s.text)
}

// outputTokens is what a whole answer to s costs in output tokens: one
// per chunk of text or of a tool call's arguments.
func (s Step) outputTokens() int { return len(s.textChunks()) + len(s.argChunks()) }

// splitWords splits text into words, each with the whitespace that follows
// it; whitespace before the first word stays with it. The pieces join back
// into text exactly, and "" gives none.
func splitWords(text string) []string {
	var chunks []string
	start := 0
	word := false  // the current chunk has a word in it
	space := false // the previous rune was whitespace
	for i, r := range text {
		isSpace := unicode.IsSpace(r)
		if !isSpace && space && word {
			chunks = append(chunks, text[start:i])
			start, word = i, false
		}
		word = word || !isSpace
		space = isSpace
	}
	if start < len(text) {
		chunks = append(chunks, text[start:])
	}
	return chunks
}
