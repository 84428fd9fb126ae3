package anthropicretry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/llmretry/llmretry"
)

// provider is the Provider of every Backend this package returns: the
// name the OpenTelemetry GenAI conventions give Anthropic. A client
// pointed at another service that serves Claude (AWS Bedrock, Vertex AI)
// is not Anthropic: set the Backend's Provider to that service's name,
// such as "aws.bedrock".
const provider = "anthropic"

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
// [llmretry.Truncation], one with stop_reason refusal a
// [llmretry.Refusal], one with neither text nor tool use a
// [llmretry.ParseFailure], and one without a stop_reason a transient
// failure; each of them keeps the reply's text as the attempt's raw text.
// The reply's usage is reported with [llmretry.ReportUsage] for an
// answer and carried in the Failure (Failure.Usage) otherwise, with the
// cache's tokens counted in InputTokens.
//
// The SDK refuses a non-streaming request that may run longer than ten
// minutes (a large max_tokens) unless it is given a request timeout. The
// Backend gives it the time left before the attempt's deadline (the
// caller's deadline or Backend.Timeout); without a deadline such a request
// fails with a configuration error, rejected and wrapping
// [llmretry.ErrConfig], that names [MessagesStream] as the way out.
//
// In a call that streams ([llmretry.WithStream]) the answer's text
// reaches the call's stream in one piece, through [llmretry.Emit], as
// Call returns it. The Backend continues an answer another attempt began
// to deliver by an assistant prefill, as the package's doc says under
// Continuation.
//
// The caller sets Retry and Timeout on the returned Backend. StallTimeout
// bounds the whole request here, since nothing reaches the caller before
// the answer is complete; prefer Timeout. Messages panics if build is nil.
// The Backend is safe for concurrent use as long as build is.
func Messages[Req any](client anthropic.Client, model string, build func(Req) anthropic.MessageNewParams) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("anthropicretry: Messages with a nil build func")
	}
	pf := new(prefill)
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:       model,
		Provider:    provider,
		CanContinue: pf.can,
		Estimate: func(req Req) llmretry.Usage {
			params := build(req)
			return estimate(&params)
		},
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			params := prepare(build, req, model)
			cont := pf.continuing(ctx, &params)
			timeout, err := requestTimeout(ctx, params)
			if err != nil {
				return llmretry.Completion{}, err
			}
			var resp *http.Response
			msg, err := client.Messages.New(ctx, params, option.WithMaxRetries(0), option.WithRequestTimeout(timeout),
				option.WithResponseInto(&resp))
			reportLimits(ctx, resp)
			if err != nil {
				return llmretry.Completion{}, pf.refused(cont, Failure(causeOf(ctx, err)))
			}
			text := cont.rest(textOf(msg))
			c, err := complete(ctx, msg, cont.held, text)
			if err == nil && (llmretry.Streaming(ctx) || cont.held != "") {
				// The call streams, or the caller holds the answer's
				// beginning: it gets the rest, whole.
				llmretry.Emit(ctx, text)
			}
			return c, err
		},
	}
}

// MessagesStream returns a Backend that streams each request with
// client.Messages.NewStreaming and answers with the whole
// [llmretry.Completion] once the stream has ended properly. Raw is the
// *anthropic.Message accumulated from the stream.
//
// With an emit, every piece of text is handed to emit as it arrives; in
// a call that streams ([llmretry.WithStream], [llmretry.Chain.Stream]),
// to the call's stream too, emit or not. Every piece goes through
// [llmretry.Emit], which marks the attempt delivered before the text
// reaches anyone, so a failure after the caller has seen text is neither
// resent nor taken to another backend. Backend.StallTimeout measures the
// gaps between events in every mode: a long tool call or thinking block
// that sends no text is alive as long as its events come.
//
// With a nil emit, in a call that does not stream, the answer is held
// until it is complete and nothing is delivered: every event the stream brings (text, a tool call's input, a
// thinking block; not the server's pings) is reported with
// [llmretry.Progress], so Backend.StallTimeout measures the gaps between
// events, and a stream that breaks off is retried or taken to the next
// backend like any other failed request. Use it to stream only so that a
// stalled answer can be cut, or in a gateway that replies once the answer
// is whole.
//
// A stream is an answer once its message_delta brings a stop_reason: the
// Backend returns then, without waiting for message_stop, which carries
// nothing more, so a proxy that drops the last event or a server that
// keeps the connection open cannot turn a whole answer into a failure. An
// error event inside the stream is mapped by [Failure]; an event that does
// not decode is a transient failure, as is a stream that stops before a
// stop_reason, cut or ending cleanly. Every failure keeps the text
// received so far as the attempt's raw text, and once message_start has
// arrived it carries the usage reported so far (see
// [llmretry.ReportUsage]). Like [Messages], it sends one HTTP request per
// call, maps stop reasons as Messages does, and model, when not empty,
// replaces the parameters' Model. It continues an answer another attempt
// began to deliver by an assistant prefill, handing only what follows to
// emit and the call's stream, as the package's doc says under
// Continuation.
//
// The caller sets Retry, StallTimeout and, as an upper bound on a whole
// answer, Timeout on the returned Backend. MessagesStream panics if build
// is nil. The Backend is safe for concurrent use as long as build and emit
// are.
func MessagesStream[Req any](client anthropic.Client, model string, build func(Req) anthropic.MessageNewParams, emit func(req Req, delta string)) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("anthropicretry: MessagesStream with a nil build func")
	}
	pf := new(prefill)
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:       model,
		Provider:    provider,
		Stream:      true,
		CanContinue: pf.can,
		Estimate: func(req Req) llmretry.Usage {
			params := build(req)
			return estimate(&params)
		},
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			params := prepare(build, req, model)
			cont := pf.continuing(ctx, &params)
			// The text goes to the caller as it arrives when there is
			// one to take it: this backend's emit, or the call's stream,
			// or a caller that holds the answer's beginning.
			deliver := emit != nil || llmretry.Streaming(ctx) || cont.held != ""
			// A request timeout of 0 overrides one set on the client: it
			// would cut a healthy stream that outlasts it, and timing
			// streams is the Backend's job.
			var resp *http.Response
			stream := client.Messages.NewStreaming(ctx, params, option.WithMaxRetries(0), option.WithRequestTimeout(0),
				option.WithResponseInto(&resp))
			defer stream.Close()
			reportLimits(ctx, resp)

			var (
				msg  anthropic.Message
				text strings.Builder
				// billed is set once message_start has brought the usage
				// block: from then on msg.Usage is what the provider
				// counts for this request, and a failure reports it.
				billed bool
			)
			fail := func(err error) (llmretry.Completion, error) {
				if billed {
					llmretry.ReportUsage(ctx, usageOf(msg.Usage))
				}
				return llmretry.Completion{}, pf.refused(cont, partial(err, text.String()))
			}
			for stream.Next() {
				ev := stream.Current()
				if err := msg.Accumulate(ev); err != nil {
					return fail(malformed(err))
				}
				// Every event is progress, text or not (a tool call's
				// input, a thinking block), in both modes: StallTimeout
				// measures the time without an event.
				llmretry.Progress(ctx)
				switch ev.Type {
				case "message_start":
					billed = true
				case "content_block_delta":
					if ev.Delta.Type != "text_delta" {
						continue
					}
					delta := cont.rest(ev.Delta.Text)
					if delta == "" {
						continue
					}
					text.WriteString(delta)
					if deliver {
						// Emit marks the attempt before the text reaches
						// anyone: once the caller may hold it, the
						// attempt must never be sent again as it was.
						llmretry.Emit(ctx, delta)
						if emit != nil {
							emit(req, delta)
						}
					}
				case "message_delta":
					if msg.StopReason == "" {
						continue
					}
					// The answer is whole: only message_stop may follow,
					// and it carries nothing. Finish the message as it
					// would, so Raw's JSON holds the streamed content.
					_ = msg.Accumulate(anthropic.MessageStreamEventUnion{Type: "message_stop"})
					return complete(ctx, &msg, cont.held, text.String())
				case "message_stop":
					// message_stop without a stop_reason before it:
					// complete calls that cut short.
					return complete(ctx, &msg, cont.held, text.String())
				}
			}
			if err := stream.Err(); err != nil {
				if isMalformed(err) {
					err = malformed(err)
				}
				return fail(causeOf(ctx, err))
			}
			// A stream that simply stops is not an answer: a proxy that
			// dropped its end, or a server that crashed between events.
			return fail(&llmretry.Failure{Kind: llmretry.KindTransient, Err: errors.New("anthropicretry: stream ended before a stop_reason")})
		},
	}
}

// isMalformed reports whether err, from the SDK's stream, is an event
// whose data does not decode, rather than a broken connection.
func isMalformed(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syntax) || errors.As(err, &typ)
}

// malformed is the failure of a stream that brought an event it could
// not read: a garbled event is most often a proxy's or a server's fault
// of the moment, and another try may well read cleanly, so it is
// transient. After delivery the chain ends on it all the same, with this
// message naming what went wrong.
func malformed(err error) *llmretry.Failure {
	return &llmretry.Failure{Kind: llmretry.KindTransient, Err: fmt.Errorf("anthropicretry: malformed stream event: %w", err)}
}

// usageOf is the chain's Usage for what the provider reported. Anthropic
// counts the prompt tokens read from and written to its cache apart from
// input_tokens; the chain's InputTokens holds the whole prompt.
func usageOf(u anthropic.Usage) llmretry.Usage {
	return llmretry.Usage{
		InputTokens:       u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens,
		OutputTokens:      u.OutputTokens,
		CachedInputTokens: u.CacheReadInputTokens,
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
// failure it stands for. text is the message's text, and held the answer
// the caller held before it, which it continues: the answer's Text is
// both, whole, and a failure keeps text alone, the attempt's own output.
// An answer's usage is reported to the attempt under ctx; a failure
// carries its own, since a cut, refused or unusable answer is billed all
// the same.
func complete(ctx context.Context, msg *anthropic.Message, held, text string) (llmretry.Completion, error) {
	usage := usageOf(msg.Usage)
	whole := held + text
	var f *llmretry.Failure
	switch msg.StopReason {
	case "":
		// Every finished message has a stop_reason; only a message still
		// being generated lacks one, so this one was cut short.
		f = &llmretry.Failure{Kind: llmretry.KindTransient, Err: errors.New("anthropicretry: answer has no stop_reason")}
	case anthropic.StopReasonMaxTokens, anthropic.StopReasonModelContextWindowExceeded:
		// Cut off by a budget: the same request stops at the same place.
		f = llmretry.Truncation(text)
		f.Err = errors.New("anthropicretry: stop_reason " + string(msg.StopReason))
	case anthropic.StopReasonRefusal:
		// The model's safety judgement, not a fault: the same content is
		// refused again, and the chain decides whether another provider
		// may see it.
		f = llmretry.Refusal("stop_reason refusal")
	default:
		if whole == "" && !usesTool(msg) {
			// Nothing the caller could use; another sample may differ.
			f = llmretry.ParseFailure(text, errors.New("anthropicretry: answer has no text and no tool use (stop_reason "+string(msg.StopReason)+")"))
		}
	}
	if f != nil {
		if text != "" {
			f.RawText = &text
		}
		f.Usage = &usage
		return llmretry.Completion{}, f
	}
	llmretry.ReportUsage(ctx, usage)
	return llmretry.Completion{
		ID:           msg.ID,
		Model:        string(msg.Model),
		Text:         whole,
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

// prefill is how a Backend of this package continues an answer the
// caller holds part of: by an assistant prefill, the held text sent as
// the conversation's last, assistant message, which Claude goes on from.
// A model that refuses a prefill (a 4xx to the request that carried it)
// is not sent another: it is learned once per Backend.
type prefill struct {
	refusedOnce atomic.Bool
}

// can is the Backend's CanContinue: yes, until a prefill was refused.
func (p *prefill) can(llmretry.Continuation) bool { return !p.refusedOnce.Load() }

// continuing adds the prefill to params when the attempt under ctx
// continues an answer, and returns what the attempt continues from.
func (p *prefill) continuing(ctx context.Context, params *anthropic.MessageNewParams) continued {
	c, ok := llmretry.Continuing(ctx)
	if !ok || c.Text == "" {
		return continued{}
	}
	// Anthropic refuses a prefill that ends with white space: the model's
	// continuation begins with it instead, and the caller has it.
	text := strings.TrimRightFunc(c.Text, unicode.IsSpace)
	params.Messages = append(slices.Clip(params.Messages), anthropic.NewAssistantMessage(anthropic.NewTextBlock(text)))
	return continued{held: c.Text, skipSpace: text != c.Text}
}

// refused is err, the failure of an attempt that continued as c, marked
// with [llmretry.ErrCannotContinue] when the provider refused the
// request for its prefill (a 4xx other than a 429); the Backend then
// sends no more prefills.
func (p *prefill) refused(c continued, err error) error {
	var f *llmretry.Failure
	if c.held == "" || !errors.As(err, &f) || f.Status < 400 || f.Status > 499 || f.Status == http.StatusTooManyRequests {
		return err
	}
	p.refusedOnce.Store(true)
	f.Err = fmt.Errorf("%w (%w)", f.Err, llmretry.ErrCannotContinue)
	return err
}

// continued is what an attempt continues from: the text the caller
// holds, "" for a new answer, and whether the model's continuation
// begins with white space the caller already has.
type continued struct {
	held      string
	skipSpace bool
}

// rest is delta, a piece of the model's text, less the white space the
// caller already has: the leading white space of the continuation, up to
// its first other character.
func (c *continued) rest(delta string) string {
	if !c.skipSpace {
		return delta
	}
	delta = strings.TrimLeftFunc(delta, unicode.IsSpace)
	c.skipSpace = delta == ""
	return delta
}
