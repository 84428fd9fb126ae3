package openairetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/llmretry/llmretry"
	"github.com/openai/openai-go/v3"
)

// PrefixStyle is how an OpenAI-compatible server is asked to go on from
// the text a caller already holds, for [WithPrefix]. OpenAI's own Chat
// Completions API has none.
type PrefixStyle int

const (
	// PrefixFlag sends the text as the conversation's last, assistant
	// message with "prefix": true, as DeepSeek (its beta base URL) and
	// Mistral take it.
	PrefixFlag PrefixStyle = iota + 1
	// ContinueFinalMessage sends the text as the conversation's last,
	// assistant message with "continue_final_message": true and
	// "add_generation_prompt": false on the request, as vLLM and SGLang
	// take it.
	ContinueFinalMessage
	// Replay sends the request again as it was, with no prefix, and
	// takes the answer up where the caller's text ends, when the answer
	// begins with exactly that text: for a server that answers the same
	// request the same way (temperature 0 and a seed, a cache, a test
	// double). An answer that begins otherwise is not delivered: the
	// attempt fails with [llmretry.ErrCannotContinue] and the server is
	// not replayed again. The replayed part is generated, and billed,
	// again.
	Replay
)

// WithPrefix returns b, a Backend of [Chat] or [ChatStream] for a server
// that continues a partial answer as style says, able to continue an
// answer the caller holds part of ([llmretry.Chain].Continue): its
// CanContinue says yes, and an attempt told to continue
// ([llmretry.Continuing]) sends the text the caller holds as a prefix,
// hands what follows to [llmretry.Emit] and answers with the whole text.
// Choose the style the server speaks: one that ignores a prefix answers
// from the start, and the caller would get the beginning twice; for a
// server you are not sure of, Replay never delivers what the caller has.
// A server that refuses the prefix (a 4xx other than a 429 to the request
// that carried it) is not sent another: the Backend learns it once, and
// that attempt fails with [llmretry.ErrCannotContinue], so the chain
// goes on without it. A Backend of [Responses] or [ResponsesStream]
// cannot continue by a prefix: told to, it fails so at once, sending
// nothing, and is not told again. WithPrefix panics unless style is
// PrefixFlag, ContinueFinalMessage or Replay.
func WithPrefix[Req any](b llmretry.Backend[Req, llmretry.Completion], style PrefixStyle) llmretry.Backend[Req, llmretry.Completion] {
	if style != PrefixFlag && style != ContinueFinalMessage && style != Replay {
		panic(fmt.Sprintf("openairetry: WithPrefix with style %d", style))
	}
	c := &continuer{prefix: style}
	b.CanContinue = func(llmretry.Continuation) bool { return !c.refusedOnce.Load() }
	return wrap(c, b)
}

// WithBackground returns b, a Backend of [ResponsesStream], with every
// request run in the background (background and store set), so that when
// its stream breaks, stalls or garbles an event after text reached the
// caller, the Backend's next attempt resumes the same response's stream
// after the last event it read ([llmretry.SetResume]), instead of asking
// for a new answer ([llmretry.Chain].Continue). The response goes on
// being generated, and billed, whatever becomes of the stream; it is
// stored by OpenAI as background responses are. A response that failed,
// or an error inside its stream, is not resumed; nor can another Backend
// resume it. A Backend of another kind gains nothing: it never has a
// response to resume.
func WithBackground[Req any](b llmretry.Backend[Req, llmretry.Completion]) llmretry.Backend[Req, llmretry.Completion] {
	c := &continuer{background: true}
	b.CanContinue = func(cont llmretry.Continuation) bool {
		_, ok := cont.Resume.(*responseCursor)
		return ok
	}
	return wrap(c, b)
}

// continuer is how a Backend continues an answer, as WithPrefix or
// WithBackground set it; its Calls find it in their context.
type continuer struct {
	prefix      PrefixStyle
	background  bool
	refusedOnce atomic.Bool // the server refused a prefix: send no more
}

type continuerKey struct{}

// wrap has b's Call run with c in its context.
func wrap[Req any](c *continuer, b llmretry.Backend[Req, llmretry.Completion]) llmretry.Backend[Req, llmretry.Completion] {
	call := b.Call
	b.Call = func(ctx context.Context, req Req) (llmretry.Completion, error) {
		return call(context.WithValue(ctx, continuerKey{}, c), req)
	}
	return b
}

// continuerOf is the continuer of the Backend whose attempt runs under
// ctx, nil when it has none.
func continuerOf(ctx context.Context) *continuer {
	c, _ := ctx.Value(continuerKey{}).(*continuer)
	return c
}

// responseCursor is where a background response's stream was left: its
// id and the sequence number of the last event read.
type responseCursor struct {
	id  string
	seq int64
}

// cannot is the failure of an attempt told to continue an answer by a
// means its Backend lacks; no request was sent. The continuer, when there
// is one, learns that it cannot.
func cannot(ctx context.Context, how string) error {
	if c := continuerOf(ctx); c != nil {
		c.refusedOnce.Store(true)
	}
	return &llmretry.Failure{
		Kind: llmretry.KindRejected,
		Err:  fmt.Errorf("openairetry: cannot continue an answer %s: %w", how, llmretry.ErrCannotContinue),
	}
}

// refused is err, the failure of an attempt, marked with
// [llmretry.ErrCannotContinue] when the attempt continued held, an
// answer the caller holds, and the server refused the request (a 4xx
// other than a 429); learn says the Backend learns not to send another,
// as for a refused prefix (a background response that is gone is that
// response's, not the Backend's).
func refused(ctx context.Context, held string, err error, learn bool) error {
	f, ok := errors.AsType[*llmretry.Failure](err)
	if held == "" || !ok || f.Status < 400 || f.Status > 499 || f.Status == http.StatusTooManyRequests {
		return err
	}
	if c := continuerOf(ctx); learn && c != nil {
		c.refusedOnce.Store(true)
	}
	f.Err = fmt.Errorf("%w (%w)", f.Err, llmretry.ErrCannotContinue)
	return err
}

// withPrefix adds held, the text the caller holds, to params as the
// server continues it, style says how; a replay sends params as they
// are.
func withPrefix(params openai.ChatCompletionNewParams, held string, style PrefixStyle) openai.ChatCompletionNewParams {
	if style == Replay {
		return params
	}
	msg := openai.ChatCompletionAssistantMessageParam{
		Content: openai.ChatCompletionAssistantMessageParamContentUnion{OfString: openai.String(held)},
	}
	if style == PrefixFlag {
		msg.SetExtraFields(map[string]any{"prefix": true})
	} else {
		params.SetExtraFields(map[string]any{"continue_final_message": true, "add_generation_prompt": false})
	}
	params.Messages = append(slices.Clip(params.Messages), openai.ChatCompletionMessageParamUnion{OfAssistant: &msg})
	return params
}

// chatContinuation is what a Chat or ChatStream attempt continues, with
// params carrying it: the text the caller holds, and how the server's
// text is taken up after it (a zero splice for a new answer); or the
// failure of an attempt told to continue by a Backend that cannot.
func chatContinuation(ctx context.Context, params openai.ChatCompletionNewParams) (openai.ChatCompletionNewParams, splice, error) {
	cont, ok := llmretry.Continuing(ctx)
	if !ok || cont.Text == "" {
		return params, splice{}, nil
	}
	c := continuerOf(ctx)
	if c == nil || c.prefix == 0 {
		return params, splice{}, cannot(ctx, "without a prefix style (WithPrefix)")
	}
	return withPrefix(params, cont.Text, c.prefix), splice{held: cont.Text, replay: c.prefix == Replay}, nil
}

// splice takes an answer up where the caller's text, held, ends, from
// the text the server sends to a request that continues it: a server
// that continued by a prefix sends what follows; a replayed request is
// answered from its start, whose first len(held) bytes must be held
// itself, which the caller has. (A continuation is never taken for an
// echo of held: a continuation may well begin with the same words.)
type splice struct {
	held    string
	replay  bool // the request was sent again as it was: the answer must begin with held
	buf     strings.Builder
	decided bool // the replayed answer began with held
	echoed  bool // the server's text begins with held, which is left out
}

// errDiverged is the failure of a replayed answer that does not begin
// with the caller's text.
var errDiverged = fmt.Errorf("openairetry: the replayed answer does not begin with the text the caller holds: %w", llmretry.ErrCannotContinue)

// take returns the part of delta, the server's next text, that follows
// what the caller holds; "" while it cannot yet tell. It fails for a
// replayed answer that does not begin with the caller's text.
func (s *splice) take(delta string) (string, error) {
	if s.decided || !s.replay {
		return delta, nil
	}
	s.buf.WriteString(delta)
	b := s.buf.String()
	n := min(len(b), len(s.held))
	switch {
	case b[:n] != s.held[:n]:
		return "", errDiverged
	case len(b) < len(s.held):
		return "", nil
	}
	s.decided, s.echoed = true, true
	return b[len(s.held):], nil
}

// end reports a replayed answer that ended before the caller's text did,
// which is not the caller's answer.
func (s *splice) end() (string, error) {
	if s.decided || !s.replay {
		return "", nil
	}
	return "", errDiverged
}

// before is the text the server's answer continues, which the whole
// answer begins with: held, unless the server sent it too.
func (s *splice) before() string {
	if s.echoed {
		return ""
	}
	return s.held
}

// diverged is the failure of an attempt whose replayed answer was not the
// caller's; the Backend is not replayed again.
func diverged(ctx context.Context, text string) error {
	if c := continuerOf(ctx); c != nil {
		c.refusedOnce.Store(true)
	}
	return withText(&llmretry.Failure{Kind: llmretry.KindRejected, Err: errDiverged}, text)
}
