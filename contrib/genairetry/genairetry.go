package genairetry

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmretry/llmretry"
	"google.golang.org/genai"
)

// GenerateContent returns a Backend that sends each request with
// client.Models.GenerateContent and answers with a [llmretry.Completion]
// whose Raw is the *genai.GenerateContentResponse.
//
// build turns the chain's request into the contents and the config to
// send; the config may be nil. model names the model to call and the
// Backend. Each call sends exactly one HTTP request: the SDK's own
// retries, its request timeout and its automatic continuation are turned
// off for it, whatever client and config say, on a copy of the config
// (build's is not changed). Errors are mapped by [Failure]. An answer
// that stopped at MAX_TOKENS is a [llmretry.Truncation], one blocked for
// its content (finishReason SAFETY, RECITATION, PROHIBITED_CONTENT,
// BLOCKLIST, SPII, IMAGE_SAFETY, IMAGE_PROHIBITED_CONTENT or
// IMAGE_RECITATION, or a prompt blocked by
// promptFeedback.blockReason) a [llmretry.Refusal], one with neither text
// nor a function call a [llmretry.ParseFailure], and one without a
// finishReason a transient failure. Usage is reported from usageMetadata
// ([llmretry.ReportUsage]).
//
// In a call that streams ([llmretry.WithStream]) the answer's text
// reaches the call's stream in one piece, through [llmretry.Emit], as
// Call returns it.
//
// The caller sets Retry and Timeout on the returned Backend. StallTimeout
// bounds the whole request here, since nothing reaches the caller before
// the answer is complete; prefer Timeout. GenerateContent panics if
// client or build is nil or model is empty. The Backend is safe for concurrent use as
// long as build is.
func GenerateContent[Req any](client *genai.Client, model string, build func(Req) ([]*genai.Content, *genai.GenerateContentConfig)) llmretry.Backend[Req, llmretry.Completion] {
	check("GenerateContent", client, model, build)
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:    model,
		Provider: providerOf(client),
		Estimate: func(req Req) llmretry.Usage { return estimate(build(req)) },
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			contents, config := build(req)
			sctx, seen := watch(ctx)
			resp, err := client.Models.GenerateContent(sctx, model, contents, oneRequest(config))
			if err != nil {
				return llmretry.Completion{}, mapError(ctx, err, seen, "")
			}
			reportLimits(ctx, seen, resp)
			u := usageOf(resp.UsageMetadata)
			if u != nil {
				llmretry.ReportUsage(ctx, *u)
			}
			c, err := complete(resp, model, textOf(candidate(resp)), u)
			if err == nil && llmretry.Streaming(ctx) {
				// The call streams: its stream has the answer too, whole.
				llmretry.Emit(ctx, c.Text)
			}
			return c, err
		},
	}
}

// GenerateContentStream returns a Backend that streams each request with
// client.Models.GenerateContentStream and answers with the whole
// [llmretry.Completion] once the stream has ended with a finishReason.
// Raw is a *genai.GenerateContentResponse: the last chunk, with the parts
// of every chunk in its candidate.
//
// With an emit, every piece of text is handed to emit as it arrives; in
// a call that streams ([llmretry.WithStream], [llmretry.Chain.Stream]),
// to the call's stream too, emit or not. Every piece goes through
// [llmretry.Emit], which marks the attempt delivered before the text
// reaches anyone, so a failure after the caller has seen text is neither
// resent nor taken to another backend. With a nil emit, in a call that
// does not stream, the answer is held until it is complete and every
// chunk calls [llmretry.Progress] instead: the caller has seen
// nothing, so a stream that breaks is retried or failed over like any
// failed request. Either way Backend.StallTimeout measures the gaps
// between chunks; a chunk without text (a thought, a function call)
// counts as progress but is never delivered.
//
// A stream is a success once a chunk carries a finishReason: Gemini sends
// no end sentinel, so the Backend stops reading there. An error inside
// the stream is mapped by [Failure]; an event the SDK cannot decode is a
// transient failure; a stream that ends, cut or cleanly, before a
// finishReason is a transient failure. Every failure keeps the text
// received so far as the attempt's raw text, and the usage of the last
// chunk that had any. Like [GenerateContent], it sends one HTTP request
// per call and maps finish reasons and blocked prompts the same way.
//
// The caller sets Retry, StallTimeout and, as an upper bound on a whole
// answer, Timeout on the returned Backend. GenerateContentStream panics
// if client or build is nil or model is empty. The Backend is safe for concurrent
// use as long as build and emit are.
func GenerateContentStream[Req any](client *genai.Client, model string, build func(Req) ([]*genai.Content, *genai.GenerateContentConfig), emit func(req Req, delta string)) llmretry.Backend[Req, llmretry.Completion] {
	check("GenerateContentStream", client, model, build)
	return llmretry.Backend[Req, llmretry.Completion]{
		Model:    model,
		Provider: providerOf(client),
		Stream:   true,
		Estimate: func(req Req) llmretry.Usage { return estimate(build(req)) },
		Call: func(ctx context.Context, req Req) (llmretry.Completion, error) {
			contents, config := build(req)
			sctx, seen := watch(ctx)
			// The text goes to the caller as it arrives when there is
			// one to take it: this backend's emit, or the call's stream.
			deliver := emit != nil || llmretry.Streaming(ctx)
			var (
				text     strings.Builder
				parts    []*genai.Part
				last     *genai.GenerateContentResponse
				usage    *llmretry.Usage
				reported bool
			)
			for chunk, err := range client.Models.GenerateContentStream(sctx, model, contents, oneRequest(config)) {
				if err != nil {
					return llmretry.Completion{}, withUsage(mapError(ctx, err, seen, text.String()), usage)
				}
				if !reported {
					reportLimits(ctx, seen, chunk)
					reported = true
				}
				last = chunk
				if u := usageOf(chunk.UsageMetadata); u != nil {
					// Each chunk's count is the total so far: the last
					// one seen is what a cut stream was billed.
					usage = u
					llmretry.ReportUsage(ctx, *u)
				}
				cand := candidate(chunk)
				delta := textOf(cand)
				if cand != nil && cand.Content != nil {
					parts = append(parts, cand.Content.Parts...)
				}
				switch {
				case delta != "" && deliver:
					text.WriteString(delta)
					// Emit marks the attempt before the text reaches
					// anyone: once the caller may hold it, the attempt
					// must never be sent again as it was.
					llmretry.Emit(ctx, delta)
					if emit != nil {
						emit(req, delta)
					}
				default:
					text.WriteString(delta)
					llmretry.Progress(ctx)
				}
				if blocked(chunk) || finished(cand) {
					// The end of the answer: Gemini sends nothing after
					// it that the answer needs.
					return complete(merged(last, parts), model, text.String(), usage)
				}
			}
			// A stream that simply stops is not an answer: a proxy that
			// dropped its end, or a server that crashed between chunks.
			return llmretry.Completion{}, unfinished("genairetry: stream ended without a finishReason", text.String(), usage)
		},
	}
}

func check[Req any](fn string, client *genai.Client, model string, build func(Req) ([]*genai.Content, *genai.GenerateContentConfig)) {
	switch {
	case client == nil:
		panic("genairetry: " + fn + " with a nil client")
	case build == nil:
		panic("genairetry: " + fn + " with a nil build func")
	case model == "":
		panic("genairetry: " + fn + " with an empty model")
	}
}

// providerOf is the Provider of a Backend that sends through client: the
// name the OpenTelemetry GenAI conventions give the API the client was
// built for, "gcp.gemini" for the Gemini API (AI Studio) and
// "gcp.vertex_ai" for Vertex AI, or "gcp.gen_ai", their name for a
// Google endpoint of either kind, when the client does not say.
func providerOf(client *genai.Client) string {
	switch client.ClientConfig().Backend {
	case genai.BackendGeminiAPI:
		return "gcp.gemini"
	case genai.BackendVertexAI:
		return "gcp.vertex_ai"
	}
	return "gcp.gen_ai"
}

// oneRequest returns a copy of config that makes the SDK send exactly
// one HTTP request: retries are the chain's, each with its own record.
// Its request timeout is set to none, since a timeout the chain cannot
// see would cut a healthy stream and report it as the SDK's bare context
// error; an attempt is bounded by Backend.Timeout. Automatic continuation
// is off because it resends the request, on its own, for a stream cut
// after a continuation token.
func oneRequest(config *genai.GenerateContentConfig) *genai.GenerateContentConfig {
	var c genai.GenerateContentConfig
	if config != nil {
		c = *config
	}
	var h genai.HTTPOptions
	if c.HTTPOptions != nil {
		h = *c.HTTPOptions
		h.Headers = h.Headers.Clone() // the SDK adds to them
	}
	h.RetryOptions = &genai.HTTPRetryOptions{Attempts: genai.Ptr[int32](1)}
	h.Timeout = genai.Ptr(time.Duration(0))
	c.HTTPOptions = &h
	c.AutomaticContinuation = genai.Ptr(false)
	return &c
}

// Transport returns an http.RoundTripper that sends each request with
// base (http.DefaultTransport when nil) and shows the Backends of this
// package the status and headers of every response. Give it to the
// client, as ClientConfig.HTTPClient's Transport, to have them read an
// error response's headers, which the SDK keeps to itself: its
// Retry-After, and its rate-limit headers for [llmretry.ReportLimits].
// Without it the Backends still read what an error's body says
// (RetryInfo, QuotaFailure) and an answer's headers. Requests not made
// by these Backends pass through unchanged. It is safe for concurrent use
// as long as base is.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base}
}

type transport struct{ base http.RoundTripper }

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if s, ok := req.Context().Value(seenKey{}).(*seen); ok && err == nil {
		s.set(resp.Header.Clone())
	}
	return resp, err
}

type seenKey struct{}

// seen is the header of the response to an attempt's request, as
// [Transport] saw it; nil when no response came or the client has no
// Transport.
type seen struct {
	mu     sync.Mutex
	header http.Header
}

func (s *seen) set(h http.Header) {
	s.mu.Lock()
	s.header = h
	s.mu.Unlock()
}

func (s *seen) get() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header
}

// watch returns ctx with a place for the Transport to leave the
// response's header in.
func watch(ctx context.Context) (context.Context, *seen) {
	s := &seen{}
	return context.WithValue(ctx, seenKey{}, s), s
}

// reportLimits hands the response's headers to the chain, for the
// backend's Breaker to pace by: the Transport's copy if there is one,
// else the SDK's.
func reportLimits(ctx context.Context, s *seen, resp *genai.GenerateContentResponse) {
	h := s.get()
	if h == nil && resp != nil && resp.SDKHTTPResponse != nil {
		h = resp.SDKHTTPResponse.Headers
	}
	if h != nil {
		llmretry.ReportLimits(ctx, h)
	}
}

// candidate is the response's first candidate, the one the SDK's own
// Text reads; nil when it has none.
func candidate(resp *genai.GenerateContentResponse) *genai.Candidate {
	if resp == nil || len(resp.Candidates) == 0 {
		return nil
	}
	return resp.Candidates[0]
}

// textOf joins the candidate's text parts, thoughts left out: they are
// the model's reasoning, not its answer.
func textOf(c *genai.Candidate) string {
	if c == nil || c.Content == nil {
		return ""
	}
	var b strings.Builder
	for _, p := range c.Content.Parts {
		if p != nil && !p.Thought {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// callsFunction reports whether the candidate asks for a function call.
func callsFunction(c *genai.Candidate) bool {
	if c == nil || c.Content == nil {
		return false
	}
	for _, p := range c.Content.Parts {
		if p != nil && p.FunctionCall != nil {
			return true
		}
	}
	return false
}

// merged is the stream's last chunk with the parts of every chunk in its
// candidate, so Raw holds the whole answer.
func merged(last *genai.GenerateContentResponse, parts []*genai.Part) *genai.GenerateContentResponse {
	resp := *last
	if c := candidate(last); c != nil {
		cand := *c
		content := genai.Content{Role: genai.RoleModel, Parts: parts}
		if c.Content != nil && c.Content.Role != "" {
			content.Role = c.Content.Role
		}
		cand.Content = &content
		resp.Candidates = append([]*genai.Candidate{&cand}, last.Candidates[1:]...)
	}
	return &resp
}

// usageOf is the usage Gemini reported, nil when it reported none.
// promptTokenCount counts cached tokens among its own, and tool-use
// prompts are billed as input too; candidatesTokenCount leaves thoughts
// out, which are billed as output.
func usageOf(m *genai.GenerateContentResponseUsageMetadata) *llmretry.Usage {
	if m == nil {
		return nil
	}
	return &llmretry.Usage{
		InputTokens:       int64(m.PromptTokenCount) + int64(m.ToolUsePromptTokenCount),
		OutputTokens:      int64(m.CandidatesTokenCount) + int64(m.ThoughtsTokenCount),
		CachedInputTokens: int64(m.CachedContentTokenCount),
		ReasoningTokens:   int64(m.ThoughtsTokenCount),
	}
}

// refusals are the finish reasons by which Gemini stops an answer for
// its content. Another sample or another provider is no cure: the chain
// keeps the refusal. RECITATION is among them: Gemini cut the answer
// off where it began to recite a source, so the text it did send is not
// an answer, and must not pass for one.
var refusals = map[genai.FinishReason]bool{
	genai.FinishReasonSafety:                 true,
	genai.FinishReasonRecitation:             true,
	genai.FinishReasonProhibitedContent:      true,
	genai.FinishReasonBlocklist:              true,
	genai.FinishReasonSPII:                   true,
	genai.FinishReasonImageSafety:            true,
	genai.FinishReasonImageProhibitedContent: true,
	genai.FinishReasonImageRecitation:        true,
}

// finished reports whether the candidate carries a finish reason: the
// model is done with it. An unspecified one is none.
func finished(c *genai.Candidate) bool {
	return c != nil && c.FinishReason != "" && c.FinishReason != genai.FinishReasonUnspecified
}

// blocked reports whether Gemini refused the prompt itself.
func blocked(resp *genai.GenerateContentResponse) bool {
	return resp.PromptFeedback != nil && resp.PromptFeedback.BlockReason != ""
}

// complete turns a finished response into the chain's answer, or into
// the failure it stands for. text is its candidate's text, u its usage.
func complete(resp *genai.GenerateContentResponse, model, text string, u *llmretry.Usage) (llmretry.Completion, error) {
	if blocked(resp) {
		f := llmretry.Refusal("genairetry: promptFeedback blockReason " + string(resp.PromptFeedback.BlockReason))
		f.Usage = u
		return llmretry.Completion{}, f
	}
	cand := candidate(resp)
	var finish genai.FinishReason
	if cand != nil {
		finish = cand.FinishReason
	}
	switch {
	case !finished(cand):
		// Every finished answer has a finishReason; only one still being
		// generated lacks it, so this one was cut short.
		return llmretry.Completion{}, unfinished("genairetry: answer has no finishReason", text, u)
	case finish == genai.FinishReasonMaxTokens:
		// Cut off by a budget: the same request stops at the same place.
		f := llmretry.Truncation(text)
		f.Err = errors.New("genairetry: finishReason MAX_TOKENS")
		f.Usage = u
		return llmretry.Completion{}, f
	case refusals[finish]:
		f := llmretry.Refusal("genairetry: finishReason " + string(finish))
		if text != "" {
			f.RawText = &text
		}
		f.Usage = u
		return llmretry.Completion{}, f
	}
	if text == "" && !callsFunction(cand) {
		// Nothing the caller could use; another sample may differ.
		f := llmretry.ParseFailure(text, errors.New("genairetry: answer has no text and no function call (finishReason "+string(finish)+")"))
		f.Usage = u
		return llmretry.Completion{}, f
	}
	c := llmretry.Completion{
		ID:         resp.ResponseID,
		Model:      resp.ModelVersion,
		Text:       text,
		StopReason: string(finish),
		Raw:        resp,
	}
	if c.Model == "" {
		c.Model = model
	}
	if u != nil {
		c.InputTokens, c.OutputTokens = u.InputTokens, u.OutputTokens
	}
	return c, nil
}

// unfinished is a response that ended before its end, a transient
// failure that keeps its text and usage.
func unfinished(msg, text string, u *llmretry.Usage) error {
	f := &llmretry.Failure{Kind: llmretry.KindTransient, Err: errors.New(msg), Usage: u}
	if text != "" {
		f.RawText = &text
	}
	return f
}

// withUsage sets u on err when err is a Failure that carries none.
func withUsage(err error, u *llmretry.Usage) error {
	var f *llmretry.Failure
	if u != nil && errors.As(err, &f) && f.Usage == nil {
		f.Usage = u
	}
	return err
}
