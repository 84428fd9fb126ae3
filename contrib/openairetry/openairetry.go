package openairetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// provider is the Provider of every Backend this package returns: the
// name the OpenTelemetry GenAI conventions give OpenAI. A client pointed
// at another service that speaks OpenAI's API (Azure OpenAI, a gateway)
// is not OpenAI: set the Backend's Provider to that service's name, such
// as "azure.ai.openai".
const provider = "openai"

// Chat returns a [llmretry.Backend] that sends each request to the Chat
// Completions API through client, without streaming. build turns the
// chain's request into the SDK's parameters; model, when not empty,
// replaces the parameters' model and names the backend in the chain's
// records. Set Retry and Timeout on the returned Backend; StallTimeout
// would bound the whole request as Timeout does, since a plain request
// delivers nothing before its answer.
//
// Every Call sends exactly one HTTP request, whatever retries the client
// was built with, and reports failures as [Failure] does. A completion cut
// off at its token budget (finish_reason "length") fails with
// [llmretry.Truncation] and the partial text; one stopped by the
// provider's content filter (finish_reason "content_filter") with
// [llmretry.Refusal] and the partial text; one with neither text nor a
// tool call fails with [llmretry.ParseFailure]; one without a finish
// reason is a transient failure, as a cut stream is. The answer's usage
// is reported with [llmretry.ReportUsage]; a failed answer carries it as
// its Failure's Usage. The answer is the
// first choice; Raw is the *openai.ChatCompletion. In a call that streams
// ([llmretry.WithStream]) the answer's text reaches the call's stream in
// one piece, through [llmretry.Emit], as Call returns it. Chat panics if
// build is nil.
func Chat[Req any](client openai.Client, model string, build func(Req) openai.ChatCompletionNewParams) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("openairetry: Chat with a nil build")
	}
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:    model,
		Provider: provider,
		Estimate: func(req Req) llmretry.Usage {
			params := build(req)
			return chatEstimate(&params)
		},
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			params, sp, err := chatContinuation(ctx, prepare(build(req), model))
			if err != nil {
				return llmretry.Completion{}, err
			}
			var resp *http.Response
			cc, err := client.Chat.Completions.New(ctx, params,
				option.WithMaxRetries(0), option.WithResponseInto(&resp))
			reportLimits(ctx, resp)
			if err != nil {
				return llmretry.Completion{}, refused(ctx, sp.held, callFailure(causeOf(ctx, err), resp), true)
			}
			var usage *llmretry.Usage
			if cc.JSON.Usage.Valid() {
				usage = chatUsage(&cc.Usage)
			}
			text := firstText(cc)
			if _, err := sp.take(text); err != nil {
				return llmretry.Completion{}, withUsage(ctx, diverged(ctx, text), usage)
			}
			if _, err := sp.end(); err != nil {
				return llmretry.Completion{}, withUsage(ctx, diverged(ctx, text), usage)
			}
			return whole(ctx, sp.held)(answer(ctx, cc, sp.before(), usage, requestSuffix(resp)))
		},
	}
}

// whole returns a function that passes an answer through, handing its
// text to the call's stream first when the call streams, or when the
// caller holds held, its beginning: a plain request's answer reaches the
// caller whole, as it is returned, less what the caller has.
func whole(ctx context.Context, held string) func(llmretry.Completion, error) (llmretry.Completion, error) {
	return func(c llmretry.Completion, err error) (llmretry.Completion, error) {
		if err == nil && (llmretry.Streaming(ctx) || held != "") {
			llmretry.Emit(ctx, strings.TrimPrefix(c.Text, held))
		}
		return c, err
	}
}

// ChatStream returns a [llmretry.Backend] that streams each request from
// the Chat Completions API through client. build and model are as for
// [Chat]; the stream also asks for the token usage
// (stream_options.include_usage), so the Completion's token counts and
// the record's usage are filled. Set Retry, Timeout and StallTimeout on
// the returned Backend.
//
// With an emit, every piece of the answer's text is handed to emit as it
// arrives, with the request it belongs to; when the call streams
// ([llmretry.WithStream], [llmretry.Chain.Stream]), to the call's stream
// too, emit or not. Every piece goes through [llmretry.Emit], which marks
// the attempt delivered before the text reaches anyone: from then on a
// failure is returned at once, neither resent nor passed to the next
// backend, since the caller already holds part of the answer. Only text
// is delivered: a stream that sends nothing but tool calls is never
// marked. In every mode each chunk it reads, text or not, is reported
// with [llmretry.Progress], which restarts StallTimeout, so StallTimeout
// measures the time without a chunk.
//
// With a nil emit, in a call that does not stream, Call holds the answer
// and returns it whole: progress delivers nothing, so a stream that
// breaks, stalls or garbles an event partway is sent again, or to the
// next backend, as a plain request would be. Use it to bound a long
// answer by its silences rather than by one Timeout.
//
// An error event inside the stream is transient, except an
// invalid_request_error or insufficient_quota, which is rejected, and a
// content_filter or content_policy_violation code, which is refused; its
// record carries the status its type stands for (500 for server_error and
// api_error, 529 for overloaded_error, 429 for rate_limit_error or code
// rate_limit_exceeded, else 0). An event that does not decode is a
// transient failure. A stream that ends without a finish reason is a
// transient failure, never a success; one that has sent its finish reason
// and its usage is answered at once, without waiting for the closing
// [DONE], and one that sent its finish reason and then breaks or falls
// silent for a second is answered without usage. Whatever text arrived
// before a failure is kept as the attempt's raw text, and usage reported
// before it is kept as the attempt's. Truncation, refusals, empty answers
// and Raw are as for [Chat], Raw holding the completion the SDK's
// accumulator built. ChatStream panics if build is nil.
func ChatStream[Req any](client openai.Client, model string, build func(Req) openai.ChatCompletionNewParams, emit func(req Req, delta string)) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("openairetry: ChatStream with a nil build")
	}
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:    model,
		Provider: provider,
		Stream:   true,
		Estimate: func(req Req) llmretry.Usage {
			params := build(req)
			return chatEstimate(&params)
		},
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			params, sp, err := chatContinuation(ctx, prepare(build(req), model))
			if err != nil {
				return llmretry.Completion{}, err
			}
			params.StreamOptions.IncludeUsage = openai.Bool(true)
			// The text goes to the caller as it arrives when there is
			// one to take it: this backend's emit, or the call's own
			// stream, or a caller that holds the answer's beginning.
			deliver := emit != nil || llmretry.Streaming(ctx) || sp.held != ""
			hand := func(delta string) {
				// Emit marks the attempt before the text reaches anyone:
				// once the caller may hold it, the attempt must never be
				// sent again as it was.
				llmretry.Emit(ctx, delta)
				if emit != nil && delta != "" {
					emit(req, delta)
				}
			}
			// The stream runs under a context of its own, so that one that
			// has finished its answer can be let go of without waiting for
			// its last bytes (see usageGrace).
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var resp *http.Response
			stream := client.Chat.Completions.NewStreaming(sctx, params,
				option.WithMaxRetries(0), option.WithResponseInto(&resp))
			defer stream.Close()
			reportLimits(ctx, resp)

			var (
				acc      openai.ChatCompletionAccumulator
				usage    *llmretry.Usage
				finished bool // the first choice has its finish reason: the answer is whole
				grace    *time.Timer
			)
			defer func() {
				if grace != nil {
					grace.Stop()
				}
			}()
			for stream.Next() {
				chunk := stream.Current()
				if !acc.AddChunk(chunk) {
					return llmretry.Completion{}, withUsage(ctx, withText(&llmretry.Failure{
						Kind: llmretry.KindTransient,
						Err:  errors.New("openairetry: stream sent a chunk the accumulator refused" + requestSuffix(resp)),
					}, firstText(&acc.ChatCompletion)), usage)
				}
				if chunk.JSON.Usage.Valid() {
					usage = chatUsage(&chunk.Usage)
				}
				// Every chunk is progress, text or not (a tool call's
				// arguments, a role), in both modes: StallTimeout measures
				// the time without a chunk.
				llmretry.Progress(ctx)
				for _, choice := range chunk.Choices {
					if choice.Index != 0 || choice.Delta.Content == "" || !deliver {
						continue
					}
					delta, err := sp.take(choice.Delta.Content)
					if err != nil {
						return llmretry.Completion{}, withUsage(ctx, diverged(ctx, firstText(&acc.ChatCompletion)), usage)
					}
					hand(delta)
				}
				if !finished && len(acc.Choices) > 0 && acc.Choices[0].FinishReason != "" {
					finished = true
					// OpenAI sends the usage in a chunk of its own after
					// the finish reason; one that never comes must not
					// hold a whole answer back.
					grace = time.AfterFunc(usageGrace, cancel)
				}
				if finished && chunk.JSON.Usage.Valid() {
					// The usage at or after the finish is the total (a
					// server may send a running count with every chunk):
					// nothing but [DONE] is still to come.
					break
				}
			}
			text := firstText(&acc.ChatCompletion)
			if err := stream.Err(); err != nil && !finished {
				return llmretry.Completion{}, withUsage(ctx, refused(ctx, sp.held, streamFailure(causeOf(ctx, err), resp, text), true), usage)
			}
			if !finished {
				// A proxy or provider that drops the stream cleanly leaves no
				// error, only a missing finish reason; taken as a success it
				// would hand the caller half an answer.
				return llmretry.Completion{}, withUsage(ctx, withText(&llmretry.Failure{
					Kind: llmretry.KindTransient,
					Err:  errors.New("openairetry: stream ended without a finish reason" + requestSuffix(resp)),
				}, text), usage)
			}
			cc := acc.ChatCompletion
			if deliver {
				rest, err := sp.end()
				if err != nil {
					return llmretry.Completion{}, withUsage(ctx, diverged(ctx, text), usage)
				}
				hand(rest)
			}
			return answer(ctx, &cc, sp.before(), usage, requestSuffix(resp))
		},
	}
}

// usageGrace is how long a chat stream that has sent its finish reason
// is read on for the usage chunk OpenAI sends right after it. The answer
// is whole by then; a server that never sends the usage, nor [DONE], only
// costs the record its usage.
const usageGrace = time.Second

// chatUsage is the chain's usage for a completion's counts.
func chatUsage(u *openai.CompletionUsage) *llmretry.Usage {
	return &llmretry.Usage{
		InputTokens:       u.PromptTokens,
		OutputTokens:      u.CompletionTokens,
		CachedInputTokens: u.PromptTokensDetails.CachedTokens,
		ReasoningTokens:   u.CompletionTokensDetails.ReasoningTokens,
	}
}

// withUsage gives a failed attempt the usage reported before it failed:
// on a *llmretry.Failure as its Usage, on any other error by
// [llmretry.ReportUsage]. usage nil leaves err as it is.
func withUsage(ctx context.Context, err error, usage *llmretry.Usage) error {
	if usage == nil {
		return err
	}
	if f, ok := err.(*llmretry.Failure); ok {
		f.Usage = usage
		return f
	}
	llmretry.ReportUsage(ctx, *usage)
	return err
}

// causeOf returns why ctx ended when err is the SDK's bare report of it.
// The SDK returns ctx.Err() as it is when a request is cut before its
// response, and "context deadline exceeded" would hide that the chain's
// Timeout or StallTimeout ended the attempt, or what the caller gave as the
// cause; anthropicretry reports the same cause for the same attempt.
func causeOf(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && err == ctxErr {
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
	}
	return err
}

// reportLimits hands the response's rate-limit headers to the chain, for
// the backend's Breaker to pace by; resp is nil when no response came. An
// error response is reported here and again by its StatusFailure: both
// are the one report of the same send, kept once.
func reportLimits(ctx context.Context, resp *http.Response) {
	if resp != nil {
		llmretry.ReportLimits(ctx, resp.Header)
	}
}

// prepare applies the backend's model to the parameters build returned.
func prepare(params openai.ChatCompletionNewParams, model string) openai.ChatCompletionNewParams {
	if model != "" {
		params.Model = model
	}
	return params
}

// firstText is the text of the first choice so far.
func firstText(cc *openai.ChatCompletion) string {
	if len(cc.Choices) == 0 {
		return ""
	}
	return cc.Choices[0].Message.Content
}

// answer turns a finished completion into the chain's answer, reporting
// its usage, or into the failure its first choice stands for, carrying
// its usage. held is the text the caller held before it, which the
// completion continues: the answer's Text is both, whole, and a failure
// keeps the completion's own text. usage is nil when the provider
// reported none; suffix names the request in messages, when known.
func answer(ctx context.Context, cc *openai.ChatCompletion, held string, usage *llmretry.Usage, suffix string) (llmretry.Completion, error) {
	if len(cc.Choices) == 0 {
		return llmretry.Completion{}, withUsage(ctx, llmretry.ParseFailure("", errors.New("openairetry: completion has no choices"+suffix)), usage)
	}
	choice := &cc.Choices[0]
	text := choice.Message.Content
	whole := held + text
	switch {
	case choice.FinishReason == "":
		// Nothing says the answer is whole: the API always names why a
		// choice stopped, so one without a reason may be partial.
		return llmretry.Completion{}, withUsage(ctx, withText(&llmretry.Failure{
			Kind: llmretry.KindTransient,
			Err:  errors.New("openairetry: answer has no finish reason" + suffix),
		}, text), usage)
	case choice.FinishReason == "length":
		f := llmretry.Truncation(text)
		f.Err = errors.New("openairetry: completion stopped at its token budget (finish reason \"length\")" + suffix)
		return llmretry.Completion{}, withUsage(ctx, f, usage)
	case choice.FinishReason == "content_filter":
		// The provider's filter stopped the answer: another backend's
		// filter may be weaker, which is no reason to try it.
		f := llmretry.Refusal("openairetry: the provider's content filter stopped the answer (finish reason \"content_filter\")" + suffix)
		return llmretry.Completion{}, withUsage(ctx, withText(f, text), usage)
	}
	// Sampling differs between tries, so an empty answer is worth another
	// one; a refusal counts as empty, and its text is kept for the record.
	if whole == "" && len(choice.Message.ToolCalls) == 0 && !legacyFunctionCall(&choice.Message) {
		return llmretry.Completion{}, withUsage(ctx, llmretry.ParseFailure(choice.Message.Refusal,
			errors.New("openairetry: answer has no text and no tool call (finish reason "+strconv.Quote(choice.FinishReason)+")"+suffix)), usage)
	}
	if usage != nil {
		llmretry.ReportUsage(ctx, *usage)
	}
	return llmretry.Completion{
		ID:           cc.ID,
		Model:        cc.Model,
		Text:         whole,
		StopReason:   choice.FinishReason,
		InputTokens:  cc.Usage.PromptTokens,
		OutputTokens: cc.Usage.CompletionTokens,
		Raw:          cc,
	}, nil
}

// legacyFunctionCall reports whether the message calls a function the old
// way (the functions parameter), which is an answer as a tool call is.
func legacyFunctionCall(m *openai.ChatCompletionMessage) bool {
	//lint:ignore SA1019 callers still using functions get their calls here.
	return m.FunctionCall.Name != ""
}

// Failure maps an error from openai-go to what the chain understands. The
// SDK's API error (*openai.Error) becomes a *llmretry.Failure built by
// [llmretry.StatusFailure] from its status and response headers, so
// retry-after, retry-after-ms and x-should-retry are honoured. Its message
// gives what the SDK's own text leaves out: the provider's error type,
// code and message, and the request id from the x-request-id header,
// passed through [llmretry.Redact] since providers quote keys back. A
// 429 with code insufficient_quota is [llmretry.KindRejected]: no retry
// can help until someone pays. A code of content_policy_violation, or
// content_filter (Azure OpenAI's 400 for a prompt its filter blocked), is
// [llmretry.KindRefused]: the content is refused, and another backend's
// filter may be weaker. An error event read from a stream is mapped as
// [ChatStream] describes. errors.As still finds the
// *openai.Error beneath.
//
// Any other error, a transport error or a *llmretry.Failure among them, is
// returned unchanged, for [llmretry.Classify] to judge. Failure(nil) is
// nil.
func Failure(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*llmretry.Failure](err); ok {
		return err
	}
	if apiErr, ok := errors.AsType[*openai.Error](err); ok && apiErr != nil {
		return apiFailure(apiErr, err)
	}
	if se, ok := errors.AsType[*ssestream.StreamError](err); ok && se != nil {
		return eventFailure(se, err, nil)
	}
	return err
}

// apiFailure describes an HTTP error response. err is the error as the
// SDK returned it, apiErr found within it.
func apiFailure(apiErr *openai.Error, err error) *llmretry.Failure {
	var h http.Header
	if apiErr.Response != nil {
		h = apiErr.Response.Header
	}
	f := llmretry.StatusFailure(apiErr.StatusCode, h, &providerError{
		msg: describe("api error", apiErr.Type, apiErr.Code, h.Get("X-Request-Id"), apiErr.Message),
		err: err,
	})
	// A 429 usually passes, but an exhausted quota does not: retrying only
	// adds requests to a bill that is not being paid.
	if apiErr.Code == "insufficient_quota" || apiErr.Type == "insufficient_quota" {
		f.Kind = llmretry.KindRejected
	}
	if refusedCode(apiErr.Code) {
		f.Kind = llmretry.KindRefused
	}
	return f
}

// refusedCode reports whether an error code says the provider refused
// the content: OpenAI's content_policy_violation, and content_filter,
// which Azure OpenAI answers with a 400 when its filter blocks a prompt.
// The same content is refused again, by this backend or, by default, by
// the chain's next one.
func refusedCode(code string) bool {
	return code == "content_policy_violation" || code == "content_filter"
}

// streamFailure maps the error that ended a stream, keeping the text that
// arrived before it. resp is the stream's response, nil when none came.
func streamFailure(err error, resp *http.Response, text string) error {
	if se, ok := errors.AsType[*ssestream.StreamError](err); ok && se != nil {
		var h http.Header
		if resp != nil {
			h = resp.Header
		}
		return withText(eventFailure(se, err, h), text)
	}
	if decodeError(err) {
		// A proxy that mangles a chunk, or a provider that cut one off:
		// the next try is likely to read whole.
		return withText(&llmretry.Failure{
			Kind: llmretry.KindTransient,
			Err:  fmt.Errorf("openairetry: stream sent an event that does not decode%s: %w", requestSuffix(resp), err),
		}, text)
	}
	mapped := Failure(err)
	if text == "" {
		return mapped
	}
	if f, ok := mapped.(*llmretry.Failure); ok {
		return withText(f, text)
	}
	// A transport error after some text: the Failure carries the text and
	// keeps the Kind the chain would have given the bare error.
	return &llmretry.Failure{
		Kind:    llmretry.Classify(err),
		RawText: &text,
		Err:     fmt.Errorf("openairetry: stream broke after %d bytes of text%s: %w", len(text), requestSuffix(resp), err),
	}
}

// callFailure maps the error of a plain request as [Failure] does, but
// for a body that does not decode, which is transient: a proxy mangled
// it or a provider cut it short, and the next try is likely to read
// whole. resp is the response, nil when none came.
func callFailure(err error, resp *http.Response) error {
	if decodeError(err) {
		return &llmretry.Failure{
			Kind: llmretry.KindTransient,
			Err:  fmt.Errorf("openairetry: response body does not decode%s: %w", requestSuffix(resp), err),
		}
	}
	return Failure(err)
}

// decodeError reports whether err is the SDK's report of an event whose
// JSON it could not decode.
func decodeError(err error) bool {
	if _, ok := errors.AsType[*json.SyntaxError](err); ok {
		return true
	}
	_, ok := errors.AsType[*json.UnmarshalTypeError](err)
	return ok
}

// withText keeps text as the failure's raw text when there is any.
func withText(f *llmretry.Failure, text string) *llmretry.Failure {
	if text != "" {
		f.RawText = &text
	}
	return f
}

// streamEvent is the body of an error event inside a stream.
type streamEvent struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"` // a string from OpenAI; other servers send numbers or null
	} `json:"error"`
}

// eventFailure describes an error event read from a 200 stream. h holds
// the stream's response headers, for the request id, when known.
func eventFailure(se *ssestream.StreamError, err error, h http.Header) *llmretry.Failure {
	var ev streamEvent
	if jerr := json.Unmarshal(se.Event.Data, &ev); jerr != nil {
		// Not the shape we know: keep the SDK's message, which quotes it.
		return &llmretry.Failure{Kind: llmretry.KindTransient, Err: &providerError{
			msg: describe("stream error", "", "", h.Get("X-Request-Id"), se.Message), err: err,
		}}
	}
	code := ""
	switch c := ev.Error.Code.(type) {
	case string:
		code = c
	case float64:
		code = strconv.FormatFloat(c, 'f', -1, 64)
	}
	kind := llmretry.KindTransient
	switch ev.Error.Type {
	case "invalid_request_error", "insufficient_quota":
		// The same request fails the same way: sending it again cannot help.
		kind = llmretry.KindRejected
	}
	if code == "insufficient_quota" {
		kind = llmretry.KindRejected
	}
	if refusedCode(code) {
		kind = llmretry.KindRefused
	}
	return &llmretry.Failure{
		Kind:   kind,
		Status: eventStatus(ev.Error.Type, code),
		Err: &providerError{
			msg: describe("stream error", ev.Error.Type, code, h.Get("X-Request-Id"), ev.Error.Message),
			err: err,
		},
	}
}

// eventStatus is the HTTP status an in-stream error's type stands for, so
// the record reads as the same failure sent as a response would; 0 when
// the type names none.
func eventStatus(typ, code string) int {
	switch {
	case typ == "overloaded_error":
		return 529
	case typ == "api_error", typ == "server_error":
		return http.StatusInternalServerError
	case typ == "rate_limit_error", code == "rate_limit_exceeded":
		return http.StatusTooManyRequests
	}
	return 0
}

// providerError is the cause inside a Failure built from the provider's
// report. Its message carries the provider's own words, which the SDK's
// error text leaves out; Unwrap returns the SDK's error, so errors.As
// finds *openai.Error beneath.
type providerError struct {
	msg string
	err error
}

func (e *providerError) Error() string { return e.msg }
func (e *providerError) Unwrap() error { return e.err }

// maxMessage bounds the provider's message in ours: an attempt line in a
// summary should stay one readable line.
const maxMessage = 500

// describe builds "openairetry: what (type t, code c, request r): message",
// leaving out the parts that are empty. Providers quote what they were
// sent, keys included ("Incorrect API key provided: sk-…"), so the text is
// redacted here, where it is made, and not only where the chain prints it.
func describe(what, typ, code, requestID, msg string) string {
	var b strings.Builder
	b.WriteString("openairetry: ")
	b.WriteString(what)
	var parts []string
	if typ != "" {
		parts = append(parts, "type "+typ)
	}
	if code != "" {
		parts = append(parts, "code "+code)
	}
	if requestID != "" {
		parts = append(parts, "request "+requestID)
	}
	if len(parts) > 0 {
		b.WriteString(" (")
		b.WriteString(strings.Join(parts, ", "))
		b.WriteString(")")
	}
	// Providers write messages across lines; ours stay on one.
	if msg = strings.Join(strings.Fields(msg), " "); msg != "" {
		if len(msg) > maxMessage {
			msg = strings.ToValidUTF8(msg[:maxMessage], "") + "…"
		}
		b.WriteString(": ")
		b.WriteString(msg)
	}
	return llmretry.Redact(b.String())
}

// requestSuffix names the response's request id for a message of ours, or
// is empty when there is none.
func requestSuffix(resp *http.Response) string {
	if resp == nil {
		return ""
	}
	if id := resp.Header.Get("X-Request-Id"); id != "" {
		return " (request " + id + ")"
	}
	return ""
}
