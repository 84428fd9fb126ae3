package openairetry

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/llmretry/llmretry"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
)

// Responses returns a [llmretry.Backend] that sends each request to the
// Responses API through client, without streaming. build turns the
// chain's request into the SDK's parameters; model, when not empty,
// replaces the parameters' model and names the backend in the chain's
// records. Set Retry and Timeout on the returned Backend, as for [Chat].
//
// Every Call sends exactly one HTTP request, whatever retries the client
// was built with, reports the response's rate-limit headers and usage,
// and reports failures as [Failure] does. The response's status decides
// the rest. "completed" is the answer, its Text the response's output
// text, its StopReason "completed" and its Raw the *responses.Response;
// one with neither text nor a call of a tool of the caller's (a
// function, custom tool, computer, shell or patch call, or an MCP
// approval request) fails with [llmretry.ParseFailure], keeping the text
// of the model's refusal, if it refused, as raw text, as [Chat] does.
// "incomplete"
// fails: for incomplete_details reason "max_output_tokens" with
// [llmretry.Truncation] and the partial text, for "content_filter" with
// [llmretry.Refusal], and for any other reason as a transient failure. "failed" fails as the response's error
// code says: server_error and vector_store_timeout are transient (status
// 500), rate_limit_exceeded transient (429), a code that names a policy
// (bio_policy, image_content_policy_violation, ...) or content_filter
// refused, and any other code rejected, since the same input fails the
// same way. A response still queued or in progress (a background
// request, which a chain cannot wait for) is a transient failure. In a
// call that streams, the answer's text reaches the call's stream whole,
// as [Chat]'s does. Responses panics if build is nil.
func Responses[Req any](client openai.Client, model string, build func(Req) responses.ResponseNewParams) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("openairetry: Responses with a nil build")
	}
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:    model,
		Provider: provider,
		Estimate: func(req Req) llmretry.Usage {
			params := build(req)
			return responsesEstimate(&params)
		},
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			if _, ok := llmretry.Continuing(ctx); ok {
				// A plain request has no stream to resume, and the
				// Responses API takes no prefix.
				return llmretry.Completion{}, cannot(ctx, "with a plain Responses request")
			}
			params := prepareResponses(build(req), model)
			var resp *http.Response
			r, err := client.Responses.New(ctx, params,
				option.WithMaxRetries(0), option.WithResponseInto(&resp))
			reportLimits(ctx, resp)
			if err != nil {
				return llmretry.Completion{}, callFailure(causeOf(ctx, err), resp)
			}
			return whole(ctx, "")(responseAnswer(ctx, r, "", "", requestSuffix(resp)))
		},
	}
}

// ResponsesStream returns a [llmretry.Backend] that streams each request
// from the Responses API through client. build and model are as for
// [Responses]. Set Retry, Timeout and StallTimeout on the returned
// Backend.
//
// Every event the stream sends, text or not (a tool call's arguments,
// a reasoning summary, a built-in tool's progress), is reported with
// [llmretry.Progress], so StallTimeout measures the time without an
// event: a stream busy calling a tool is not cut. With an emit, or in a
// call that streams ([llmretry.WithStream]), each
// response.output_text.delta is handed to [llmretry.Emit], and to emit,
// as it arrives, as [ChatStream] does: from then on a failure ends the
// chain. With a nil emit in a call that does not stream, the answer is
// held and returned whole, and a failure partway is sent again or to the
// next backend, as [ChatStream] does.
//
// The stream ends at its first response.completed, response.incomplete
// or response.failed event, whose response is judged as [Responses]
// judges one, without reading further. An error event fails as a failed
// response's code does, with the same statuses; an event that does not
// decode, a stream cut by the network and a stream that ends before its
// response does are transient failures. Whatever text arrived before a
// failure is kept as the attempt's raw text. ResponsesStream panics if
// build is nil.
func ResponsesStream[Req any](client openai.Client, model string, build func(Req) responses.ResponseNewParams, emit func(req Req, delta string)) llmretry.Backend[Req, llmretry.Completion] {
	if build == nil {
		panic("openairetry: ResponsesStream with a nil build")
	}
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:    model,
		Provider: provider,
		Stream:   true,
		Estimate: func(req Req) llmretry.Usage {
			params := build(req)
			return responsesEstimate(&params)
		},
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			params := prepareResponses(build(req), model)
			background := false
			if c := continuerOf(ctx); c != nil && c.background {
				// Run in the background, the response goes on whatever
				// becomes of this stream, and a retry can read on.
				params.Background, params.Store = openai.Bool(true), openai.Bool(true)
				background = true
			}
			var (
				resp   *http.Response
				stream *ssestream.Stream[responses.ResponseStreamEventUnion]
				cursor *responseCursor // where the response's stream is, for a retry to resume; nil when it cannot be
				held   string          // what the caller holds, which a resumed stream goes on from
			)
			if cont, ok := llmretry.Continuing(ctx); ok {
				c, isCursor := cont.Resume.(*responseCursor)
				if !isCursor {
					return llmretry.Completion{}, cannot(ctx, "with a new Responses request (only a background response's stream resumes)")
				}
				held, cursor = cont.Text, &responseCursor{id: c.id, seq: c.seq}
				stream = client.Responses.GetStreaming(ctx, c.id, responses.ResponseGetParams{StartingAfter: openai.Int(c.seq)},
					option.WithMaxRetries(0), option.WithResponseInto(&resp))
			} else {
				stream = client.Responses.NewStreaming(ctx, params,
					option.WithMaxRetries(0), option.WithResponseInto(&resp))
			}
			// Close lets the connection go at once when the stream ends at
			// its terminal event, before the body has.
			defer stream.Close()
			reportLimits(ctx, resp)
			deliver := emit != nil || llmretry.Streaming(ctx) || held != ""

			var text strings.Builder
			for stream.Next() {
				ev := stream.Current()
				// Every event is progress, text or not (a tool call's
				// arguments, a reasoning summary, a tool's progress), in
				// both modes: StallTimeout measures the time without an
				// event, as it does for ChatStream.
				llmretry.Progress(ctx)
				if ev.Type == "response.created" && background {
					cursor = &responseCursor{id: ev.Response.ID}
				}
				if cursor != nil {
					// Read up to here: a resumption starts after it.
					cursor = &responseCursor{id: cursor.id, seq: ev.SequenceNumber}
					llmretry.SetResume(ctx, cursor)
				}
				switch ev.Type {
				case "response.output_text.delta":
					if ev.Delta == "" {
						continue
					}
					text.WriteString(ev.Delta)
					if deliver {
						// Emit marks the attempt before the text reaches
						// anyone: once the caller may hold it, the
						// attempt must never be sent again as it was.
						llmretry.Emit(ctx, ev.Delta)
						if emit != nil {
							emit(req, ev.Delta)
						}
					}
				case "response.completed", "response.incomplete", "response.failed":
					r := ev.Response
					return responseAnswer(ctx, &r, held, text.String(), requestSuffix(resp))
				case "error":
					// The response failed: nothing of it to resume.
					llmretry.SetResume(ctx, nil)
					return llmretry.Completion{}, withText(codeFailure("stream error", ev.Code, ev.Message, resp), text.String())
				}
			}
			if err := stream.Err(); err != nil {
				// A resumed response the server no longer has is gone
				// for this answer, not for the Backend.
				return llmretry.Completion{}, refused(ctx, held, streamFailure(causeOf(ctx, err), resp, text.String()), false)
			}
			// Cut cleanly by a proxy or the provider: without its last
			// event nothing says the answer is whole.
			return llmretry.Completion{}, withText(&llmretry.Failure{
				Kind: llmretry.KindTransient,
				Err:  errors.New("openairetry: stream ended before its response did (no response.completed)" + requestSuffix(resp)),
			}, text.String())
		},
	}
}

// prepareResponses applies the backend's model to the parameters build
// returned.
func prepareResponses(params responses.ResponseNewParams, model string) responses.ResponseNewParams {
	if model != "" {
		params.Model = model
	}
	return params
}

// responsesUsage is the chain's usage for a response's counts.
func responsesUsage(u *responses.ResponseUsage) *llmretry.Usage {
	return &llmretry.Usage{
		InputTokens:       u.InputTokens,
		OutputTokens:      u.OutputTokens,
		CachedInputTokens: u.InputTokensDetails.CachedTokens,
		ReasoningTokens:   u.OutputTokensDetails.ReasoningTokens,
	}
}

// responseAnswer turns a response as it ended into the chain's answer,
// reporting its usage, or into the failure its status stands for,
// carrying its usage. held is the text the caller held of a response
// whose stream was resumed, streamed the text a stream delivered: the
// answer's text is the response's own, whole, or held and streamed when
// it holds none; a failure keeps the attempt's own text, which is
// streamed when the stream was resumed. suffix names the request in
// messages.
func responseAnswer(ctx context.Context, r *responses.Response, held, streamed, suffix string) (llmretry.Completion, error) {
	var usage *llmretry.Usage
	if r.JSON.Usage.Valid() {
		usage = responsesUsage(&r.Usage)
	}
	whole := r.OutputText()
	if whole == "" {
		whole = held + streamed
	}
	text := whole // what a failure keeps: the attempt's own output
	if held != "" {
		text = streamed
	}
	switch r.Status {
	case responses.ResponseStatusCompleted:
	case responses.ResponseStatusIncomplete:
		switch reason := r.IncompleteDetails.Reason; reason {
		case "max_output_tokens":
			f := llmretry.Truncation(text)
			f.Err = errors.New("openairetry: response stopped at its token budget (incomplete, reason \"max_output_tokens\")" + suffix)
			return llmretry.Completion{}, withUsage(ctx, f, usage)
		case "content_filter":
			// As for a chat completion's content_filter: another
			// backend's filter may be weaker, which is no reason to try it.
			f := llmretry.Refusal("openairetry: the provider's content filter stopped the response (incomplete, reason \"content_filter\")" + suffix)
			return llmretry.Completion{}, withUsage(ctx, withText(f, text), usage)
		default:
			return llmretry.Completion{}, withUsage(ctx, withText(&llmretry.Failure{
				Kind: llmretry.KindTransient,
				Err:  errors.New("openairetry: response incomplete (reason " + strconv.Quote(reason) + ")" + suffix),
			}, text), usage)
		}
	case responses.ResponseStatusFailed:
		f := codeFailure("response failed", string(r.Error.Code), r.Error.Message, nil)
		f.Err = errors.New(f.Err.Error() + suffix)
		return llmretry.Completion{}, withUsage(ctx, withText(f, text), usage)
	default:
		return llmretry.Completion{}, withUsage(ctx, withText(&llmretry.Failure{
			Kind: llmretry.KindTransient,
			Err:  errors.New("openairetry: response not finished (status " + strconv.Quote(string(r.Status)) + ")" + suffix),
		}, text), usage)
	}
	if whole == "" && !hasFunctionCall(r) {
		// Sampling differs between tries, so an empty answer is worth
		// another one; a refusal counts as empty, and its text is kept
		// for the record, as Chat keeps a message's refusal.
		return llmretry.Completion{}, withUsage(ctx, llmretry.ParseFailure(refusalOf(r),
			errors.New("openairetry: response has no text and no function call"+suffix)), usage)
	}
	if usage != nil {
		llmretry.ReportUsage(ctx, *usage)
	}
	return llmretry.Completion{
		ID:           r.ID,
		Model:        r.Model,
		Text:         whole,
		StopReason:   string(r.Status),
		InputTokens:  r.Usage.InputTokens,
		OutputTokens: r.Usage.OutputTokens,
		Raw:          r,
	}, nil
}

// refusalOf is the text of the response's refusals: the refusal parts of
// its output messages, joined.
func refusalOf(r *responses.Response) string {
	var b strings.Builder
	for _, item := range r.Output {
		if item.Type != "message" {
			continue
		}
		for _, part := range item.Content {
			if part.Type == "refusal" {
				b.WriteString(part.Refusal)
			}
		}
	}
	return b.String()
}

// hasFunctionCall reports whether the response asks the caller to make a
// tool call, which is an answer as text is. The tools OpenAI runs itself
// (web search, file search, code interpreter) are not: their results
// come back as text, and a response with nothing but them has answered
// nothing.
func hasFunctionCall(r *responses.Response) bool {
	for _, item := range r.Output {
		switch item.Type {
		case "function_call", "custom_tool_call", "computer_call", "local_shell_call", "shell_call", "apply_patch_call", "mcp_approval_request":
			return true
		}
	}
	return false
}

// codeFailure describes a failed response's error, or an error event, by
// its code. resp is the stream's response, for the request id, when
// known.
func codeFailure(what, code, msg string, resp *http.Response) *llmretry.Failure {
	var h http.Header
	if resp != nil {
		h = resp.Header
	}
	kind, status := codeKind(code)
	return &llmretry.Failure{
		Kind:   kind,
		Status: status,
		Err:    errors.New(describe(what, "", code, h.Get("X-Request-Id"), msg)),
	}
}

// codeKind is how the chain takes a Responses API error code, and the
// HTTP status it stands for (0 for none).
func codeKind(code string) (llmretry.Kind, int) {
	switch {
	case code == "" || code == "server_error" || code == "api_error" || code == "vector_store_timeout":
		// A fault of the provider's, which the next try may not meet.
		return llmretry.KindTransient, eventStatus(code, code)
	case code == "overloaded_error":
		return llmretry.KindTransient, 529
	case code == "rate_limit_exceeded" || code == "rate_limit_error":
		return llmretry.KindTransient, http.StatusTooManyRequests
	case refusedCode(code) || code == "bio_policy" || code == "image_content_policy_violation":
		// Only the codes known to name a content policy: a refusal ends
		// the chain, which an unknown code must not do.
		return llmretry.KindRefused, 0
	}
	// invalid_prompt, insufficient_quota, invalid_image and the like: the same input fails
	// the same way.
	return llmretry.KindRejected, 0
}
