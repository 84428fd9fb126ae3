package anthropicretry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/llmretry/llmretry"
)

// Messages returns a Backend that sends each request to the Messages API
// with client.Messages.New and answers with a [llmretry.Completion] whose Raw
// is the *anthropic.Message.
//
// build turns the chain's request into the API's parameters; model, when
// not empty, replaces the parameters' Model and names the Backend (an
// empty model keeps the parameters' and is recorded as "unknown"). Each
// call sends exactly one HTTP request: the SDK's own retries are turned
// off, whatever client was built with. Errors are mapped by [Failure]. A
// reply that stopped at max_tokens (or at the model's context window) is a
// [llmretry.Truncation], one with neither text nor tool use a
// [llmretry.ParseFailure], and one without a stop_reason a transient
// failure.
//
// The SDK refuses a non-streaming request that may run longer than ten
// minutes (a large max_tokens) unless it is given a request timeout. The
// Backend gives it the time left before the attempt's deadline (the
// caller's deadline or Backend.Timeout); without a deadline such a request
// fails with a configuration error, rejected and wrapping
// [llmretry.ErrConfig], that names [MessagesStream] as the way out.
//
// The caller sets Retry and Timeout on the returned Backend. StallTimeout
// bounds the whole request here, since nothing reaches the caller before
// the answer is complete; prefer Timeout. Messages panics if build is nil.
// The Backend is safe for concurrent use as long as build is.
func Messages[Req any](client anthropic.Client, model string, build func(Req) anthropic.MessageNewParams) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("anthropicretry: Messages with a nil build func")
	}
	return llmretry.Backend[Req, llmretry.Completion]{
		Model: model,
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			params := prepare(build, req, model)
			timeout, err := requestTimeout(ctx, params)
			if err != nil {
				return llmretry.Completion{}, err
			}
			var resp *http.Response
			msg, err := client.Messages.New(ctx, params, option.WithMaxRetries(0), option.WithRequestTimeout(timeout),
				option.WithResponseInto(&resp))
			reportLimits(ctx, resp)
			if err != nil {
				return llmretry.Completion{}, Failure(causeOf(ctx, err))
			}
			return complete(msg, textOf(msg))
		},
	}
}

// MessagesStream returns a Backend that streams each request with
// client.Messages.NewStreaming, hands every piece of text to emit as it
// arrives, and answers with the whole [llmretry.Completion] once the stream
// has ended properly. Raw is the *anthropic.Message accumulated from the
// stream.
//
// Before emit sees the first non-empty text, and again before every later
// piece of text, the Backend calls [llmretry.Delivered], so a failure after
// the caller has seen text is neither resent nor taken to another backend,
// and Backend.StallTimeout measures the gaps between pieces of text. Only
// text counts: a long tool call or thinking block that sends no text
// counts as a stall. A nil emit drops the text but still marks delivery,
// as if the caller had seen it.
//
// A stream is a success only when it ends with message_stop after a
// stop_reason. An error event inside the stream is mapped by [Failure]; a
// stream that stops early, cut or ending cleanly without message_stop or
// stop_reason, is a transient failure. Every failure keeps the text
// received so far as the attempt's raw text. Like [Messages], it sends one
// HTTP request per call, maps max_tokens to a truncation and an answer
// with neither text nor tool use to a parse failure, and model, when not
// empty, replaces the parameters' Model.
//
// The caller sets Retry, StallTimeout and, as an upper bound on a whole
// answer, Timeout on the returned Backend. MessagesStream panics if build
// is nil. The Backend is safe for concurrent use as long as build and emit
// are.
func MessagesStream[Req any](client anthropic.Client, model string, build func(Req) anthropic.MessageNewParams, emit func(req Req, delta string)) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("anthropicretry: MessagesStream with a nil build func")
	}
	return llmretry.Backend[Req, llmretry.Completion]{
		Model: model,
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			params := prepare(build, req, model)
			// A request timeout of 0 overrides one set on the client: it
			// would cut a healthy stream that outlasts it, and timing
			// streams is the Backend's job.
			var resp *http.Response
			stream := client.Messages.NewStreaming(ctx, params, option.WithMaxRetries(0), option.WithRequestTimeout(0),
				option.WithResponseInto(&resp))
			defer stream.Close()
			reportLimits(ctx, resp)

			var (
				msg     anthropic.Message
				text    strings.Builder
				stopped bool
			)
			for stream.Next() {
				ev := stream.Current()
				if err := msg.Accumulate(ev); err != nil {
					return llmretry.Completion{}, partial(fmt.Errorf("anthropicretry: malformed stream: %w", err), text.String())
				}
				switch ev.Type {
				case "content_block_delta":
					if ev.Delta.Type != "text_delta" || ev.Delta.Text == "" {
						continue
					}
					text.WriteString(ev.Delta.Text)
					// Mark before handing over: once the caller may hold
					// the text, the attempt must never be sent again.
					llmretry.Delivered(ctx)
					if emit != nil {
						emit(req, ev.Delta.Text)
					}
				case "message_stop":
					stopped = true
				}
			}
			if err := stream.Err(); err != nil {
				return llmretry.Completion{}, partial(causeOf(ctx, err), text.String())
			}
			if !stopped {
				// A stream that simply stops is not an answer: a proxy
				// that dropped its end, or a server that crashed between
				// events.
				return llmretry.Completion{}, unfinished("anthropicretry: stream ended without message_stop", text.String())
			}
			return complete(&msg, text.String())
		},
	}
}

// causeOf returns why ctx ended when err is the SDK's bare report of
// it. The SDK returns ctx.Err() as it is, and "context canceled" would
// hide that the chain's StallTimeout or Timeout ended the attempt, or
// what the caller gave as the cause.
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

// prepare builds the parameters for req, with model in place of theirs.
func prepare[Req any](build func(Req) anthropic.MessageNewParams, req Req, model string) anthropic.MessageNewParams {
	params := build(req)
	if model != "" {
		params.Model = anthropic.Model(model)
	}
	return params
}

// requestTimeout is the request timeout to give the SDK for a
// non-streaming request: the time left before ctx's deadline, so the SDK
// neither refuses a long request nor cuts it at its own ten minutes; or,
// without a deadline, 0, which lets the SDK choose as it would for a client
// without a timeout. A request the SDK would then refuse is a
// configuration error here, so it is told apart from an outage.
func requestTimeout(ctx context.Context, params anthropic.MessageNewParams) (time.Duration, error) {
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		if left <= 0 {
			// The attempt is already over; the chain reads the context.
			return 0, causeOf(ctx, ctx.Err())
		}
		return left, nil
	}
	if _, err := anthropic.CalculateNonStreamingTimeout(int(params.MaxTokens), params.Model, nil); err != nil {
		return 0, &llmretry.Failure{Kind: llmretry.KindRejected, Err: &configError{model: string(params.Model), maxTokens: params.MaxTokens, err: err}}
	}
	return 0, nil
}

// configError is a non-streaming request that the SDK refuses to send
// without a request timeout, made with no deadline to derive one from.
type configError struct {
	model     string
	maxTokens int64
	err       error // the SDK's refusal
}

func (e *configError) Error() string {
	return "anthropicretry: " + e.model + " with max_tokens " + strconv.FormatInt(e.maxTokens, 10) +
		" needs MessagesStream, or a deadline on the context or Backend.Timeout: " + e.err.Error()
}

// Unwrap returns llmretry.ErrConfig, so errors.Is finds it.
func (e *configError) Unwrap() error { return llmretry.ErrConfig }

// ItemRetryable reports false: the same item fails the same way until the
// code changes.
func (e *configError) ItemRetryable() bool { return false }

// textOf joins the text blocks of msg.
func textOf(msg *anthropic.Message) string {
	var b strings.Builder
	for i := range msg.Content {
		if msg.Content[i].Type == "text" {
			b.WriteString(msg.Content[i].Text)
		}
	}
	return b.String()
}

// usesTool reports whether msg asks for a tool, of the caller's or the
// server's own.
func usesTool(msg *anthropic.Message) bool {
	for i := range msg.Content {
		if strings.HasSuffix(msg.Content[i].Type, "tool_use") {
			return true
		}
	}
	return false
}

// complete turns a finished message into the chain's answer, or into the
// failure it stands for. text is the message's text.
func complete(msg *anthropic.Message, text string) (llmretry.Completion, error) {
	switch msg.StopReason {
	case "":
		// Every finished message has a stop_reason; only a message still
		// being generated lacks one, so this one was cut short.
		return llmretry.Completion{}, unfinished("anthropicretry: answer has no stop_reason", text)
	case anthropic.StopReasonMaxTokens, anthropic.StopReasonModelContextWindowExceeded:
		// Cut off by a budget: the same request stops at the same place.
		f := llmretry.Truncation(text)
		f.Err = errors.New("anthropicretry: stop_reason " + string(msg.StopReason))
		return llmretry.Completion{}, f
	}
	if text == "" && !usesTool(msg) {
		// Nothing the caller could use; another sample may differ.
		return llmretry.Completion{}, llmretry.ParseFailure(text, errors.New("anthropicretry: answer has no text and no tool use (stop_reason "+string(msg.StopReason)+")"))
	}
	return llmretry.Completion{
		Model:        string(msg.Model),
		Text:         text,
		StopReason:   string(msg.StopReason),
		InputTokens:  msg.Usage.InputTokens,
		OutputTokens: msg.Usage.OutputTokens,
		Raw:          msg,
	}, nil
}

// partial maps a stream's failure and keeps the text received before it.
func partial(err error, text string) error {
	mapped := Failure(err)
	f, ok := mapped.(*llmretry.Failure)
	if !ok && text == "" {
		// Nothing to carry: the chain classifies the error itself, and the
		// record reads as that of a plain request (or of openairetry's
		// stream) cut the same way, "llmretry: attempt timeout" for one.
		return mapped
	}
	if !ok {
		// A transport error: classify it now, as the chain would have, so
		// that it can carry the text.
		f = &llmretry.Failure{Kind: llmretry.Classify(err), Err: err}
	}
	if text != "" {
		f.RawText = &text
	}
	return f
}

// unfinished is a stream that ended cleanly before its end.
func unfinished(msg, text string) error {
	f := &llmretry.Failure{Kind: llmretry.KindTransient, Err: errors.New(msg)}
	if text != "" {
		f.RawText = &text
	}
	return f
}

// Failure maps an error from anthropic-sdk-go to the chain's terms, and is
// what the Backends of this package apply to every error of the SDK. It
// returns nil for nil.
//
// An *anthropic.Error becomes a *llmretry.Failure built by
// [llmretry.StatusFailure] from the status and response headers (so
// retry-after, retry-after-ms and x-should-retry count). Its cause is an
// error that unwraps to the *anthropic.Error and whose message gives the
// provider's error type, message and request id (the request-id header),
// passed through [llmretry.Redact]:
//
//	anthropicretry: overloaded_error: Overloaded (request-id req_1)
//
// authentication_error, permission_error and not_found_error are rejected
// whatever the headers say: no retry fixes a key or a model name.
//
// An error event inside a stream that began with 200 has no status of its
// own; the record gets the status its type stands for: 529 for
// overloaded_error, 500 for api_error, 429 for rate_limit_error, else 0.
// overloaded_error, api_error, rate_limit_error and timeout_error are
// transient; invalid_request_error, authentication_error,
// permission_error, not_found_error and billing_error are rejected; other
// types are unknown.
//
// Any other error (a refused connection, a timeout, a context error, an
// error already mapped) is returned unchanged: [llmretry.Classify] knows
// those.
func Failure(err error) error {
	if err == nil {
		return nil
	}
	// errors.As rather than errors.AsType, which would need Go 1.26: the
	// SDK needs only 1.25, and so does this package.
	var mapped *llmretry.Failure
	if errors.As(err, &mapped) {
		return err
	}
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		return err
	}
	var header http.Header
	if apiErr.Response != nil {
		header = apiErr.Response.Header
	}
	typ := apiErr.Type()
	cause := &apiError{err: apiErr}
	if apiErr.StatusCode < 400 {
		// An error event in a stream that had answered 200.
		cause.inStream = true
		info := streamErrors[typ]
		f := llmretry.StatusFailure(info.status, header, cause)
		f.Kind = info.kind
		return f
	}
	f := llmretry.StatusFailure(apiErr.StatusCode, header, cause)
	switch typ {
	case anthropic.ErrorTypeAuthenticationError, anthropic.ErrorTypePermissionError, anthropic.ErrorTypeNotFoundError:
		f.Kind = llmretry.KindRejected
	}
	return f
}

// streamErrors gives, for an error event inside a stream, the status its
// type stands for in the records and how it fails. A type not listed has
// no status and is unknown.
var streamErrors = map[anthropic.ErrorType]struct {
	status int
	kind   llmretry.Kind
}{
	anthropic.ErrorTypeOverloadedError:     {529, llmretry.KindTransient},
	anthropic.ErrorTypeAPIError:            {http.StatusInternalServerError, llmretry.KindTransient},
	anthropic.ErrorTypeRateLimitError:      {http.StatusTooManyRequests, llmretry.KindTransient},
	anthropic.ErrorTypeTimeoutError:        {0, llmretry.KindTransient},
	anthropic.ErrorTypeInvalidRequestError: {0, llmretry.KindRejected},
	anthropic.ErrorTypeAuthenticationError: {0, llmretry.KindRejected},
	anthropic.ErrorTypePermissionError:     {0, llmretry.KindRejected},
	anthropic.ErrorTypeNotFoundError:       {0, llmretry.KindRejected},
	anthropic.ErrorTypeBillingError:        {0, llmretry.KindRejected},
}

// apiError is the cause of a mapped API error: a one-line message with
// what the provider said, redacted, over the SDK's own error. The SDK's
// message holds the request URL and the whole body instead.
type apiError struct {
	err      *anthropic.Error
	inStream bool
}

func (e *apiError) Error() string {
	var b strings.Builder
	b.WriteString("anthropicretry: ")
	if typ := string(e.err.Type()); typ != "" {
		b.WriteString(typ)
	} else {
		b.WriteString("error")
	}
	if e.inStream {
		b.WriteString(" in stream")
	}
	msg := e.err.Message
	if msg == "" && !e.inStream {
		msg = http.StatusText(e.err.StatusCode)
	}
	if msg != "" {
		b.WriteString(": ")
		b.WriteString(oneLine(msg))
	}
	if e.err.RequestID != "" {
		b.WriteString(" (request-id ")
		b.WriteString(e.err.RequestID)
		b.WriteString(")")
	}
	// Providers echo what they were sent, keys and URLs among it.
	return llmretry.Redact(b.String())
}

// Unwrap returns the SDK's error, for errors.As to *anthropic.Error.
func (e *apiError) Unwrap() error { return e.err }

// oneLine keeps a provider's message to one line, as our errors are.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
