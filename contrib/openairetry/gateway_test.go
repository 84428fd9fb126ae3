package openairetry_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestGateway plays a chain of two openairetry backends as a thin
// OpenAI-compatible gateway, configured as the docs recommend for an
// interactive caller (a few short waits, MaxTries, a Reserve, a silent
// backend failed over at once, StallTimeout for streams and Timeout for
// plain requests, a Breaker per deployment), against sixteen
// faults of a primary and a secondary provider, and variants of them.
// Each fault runs in three rows per API: Chat and ChatStream with a nil
// emit hold the answer until it is whole (the buffering gateway); the
// streaming gateway streams each call to its client (WithStream) through
// ChatStream replayed after a cut (WithPrefix, Replay), a chain that continues an
// answer cut after text (Chain.Continue), and no restarts, which an
// OpenAI client could not follow; Responses and ResponsesStream the same,
// the latter run in the background (WithBackground) so that its stream
// resumes, for the faults llmretrytest plays in both APIs. Every row must
// end each fault in a pass or, where text already reached the client and
// cannot be continued, in a safe error: no text sent twice, no fault
// retried without bound, and the records agree with the requests the
// providers logged.
func TestGateway(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// setup scripts the primary and the secondary provider.
		setup func(t *testing.T) (primary, secondary provider)
		// calls is how many requests the gateway serves, one after the
		// other, through the same backends (and so the same breakers).
		calls int
		// held is the outcome when the gateway holds the answer (Chat,
		// and ChatStream with a nil emit); plain, when set, replaces it
		// for Chat alone; streamed for the streaming gateway, and
		// respStreamed for its Responses row, when they differ.
		held, plain, streamed, respStreamed *outcome
		// chatOnly is set for hand-written faults, whose bodies speak
		// Chat Completions alone.
		chatOnly bool
	}{
		{
			name: "rate_limited_retry_after",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.Status(429).WithHeader("Retry-After", "1"), answerStep), scripted(t, secondaryModel)
			},
			// The hint is honoured: one wait of a second, then the answer.
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}, hinted: time.Second},
		},
		{
			name: "rate_limited_retry_after_long",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.Status(429).WithHeader("Retry-After", "60")), scripted(t, secondaryModel, answerStep)
			},
			// A wait past the caller's deadline is not taken: the
			// secondary answers now.
			held: &outcome{by: secondaryModel, requests: [2]int{1, 1}},
		},
		{
			name: "rate_limited",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.Status(429), answerStep), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name: "server_error_once",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.Status(500), answerStep), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name: "unavailable_persistent",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, unavailable, unavailable, unavailable), scripted(t, secondaryModel, answerStep)
			},
			// MaxTries bounds the primary; then the secondary answers.
			held: &outcome{by: secondaryModel, requests: [2]int{3, 1}},
		},
		{
			name: "reset_before_headers",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.Hangup(), answerStep), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name:     "tcp_reset_before_headers",
			chatOnly: true,
			setup: func(t *testing.T) (provider, provider) {
				return handWritten(t, primaryModel,
					play{name: "reset", reset: true},
					play{name: "answer", stream: chatRole + chatHello + chatFinish + chatUsage + chatDone, json: chatAnswer},
				), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name: "reset_on_reused_connection",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, answerStep, llmretrytest.Hangup(), answerStep), scripted(t, secondaryModel)
			},
			// The second call's request goes out on the connection the
			// first one left idle: its hangup is one attempt, retried by
			// the chain, not a request net/http sends again unseen.
			calls: 2,
			held:  &outcome{by: primaryModel, requests: [2]int{3, 0}},
		},
		{
			name: "no_response",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.StallHeaders(), answerStep), scripted(t, secondaryModel, answerStep)
			},
			// StallTimeout (Timeout, for Chat) cuts the silent request,
			// and the silent primary costs one try: the secondary
			// answers.
			held: &outcome{by: secondaryModel, requests: [2]int{1, 1}},
		},
		{
			name: "slow_first_token",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, answerStep.After(2*stall), answerStep), scripted(t, secondaryModel, answerStep)
			},
			// A stream silent past StallTimeout is cut before any text and
			// the secondary answers; a plain request waits within its
			// Timeout.
			held:  &outcome{by: secondaryModel, requests: [2]int{1, 1}},
			plain: &outcome{by: primaryModel, requests: [2]int{1, 0}},
		},
		{
			name: "slow_first_token_persistent",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, answerStep.After(2*stall)), scripted(t, secondaryModel, answerStep)
			},
			// A primary that is always slower than StallTimeout is given
			// up on after its first try, before any text, for the
			// secondary.
			held:  &outcome{by: secondaryModel, requests: [2]int{1, 1}},
			plain: &outcome{by: primaryModel, requests: [2]int{1, 0}},
		},
		{
			// The client holds three chunks: the gateway goes on from
			// them, and sends each once.
			name: "stream_cut_mid_answer",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, answerStep.DropAfter(3), answerStep), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name: "stream_stalls",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, answerStep.StallAfter(2), answerStep), scripted(t, secondaryModel, answerStep)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
			// A plain request's headers came, and then nothing: no
			// output before its Timeout, so the primary is silent.
			plain: &outcome{by: secondaryModel, requests: [2]int{1, 1}},
		},
		{
			name: "error_event_mid_answer",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, answerStep.FailAfter(2, "server_error"), answerStep), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
			// A background response that failed has nothing to resume,
			// and the client could not follow a restart: the gateway
			// ends its answer with an error rather than send the text
			// again.
			respStreamed: &outcome{kind: llmretry.KindTransient, why: llmretry.WhyDelivered, retryItem: true, requests: [2]int{1, 0}},
		},
		{
			name:     "malformed_event_mid_stream",
			chatOnly: true,
			setup: func(t *testing.T) (provider, provider) {
				return handWritten(t, primaryModel,
					play{name: "malformed", stream: chatRole + chatHello + chatGarbled, json: `{"id":"c1","object":"chat.completion","choices":[{"ind`},
					play{name: "answer", stream: chatRole + chatHello + chatFinish + chatUsage + chatDone, json: chatAnswer},
				), scripted(t, secondaryModel)
			},
			// The client holds "Hello": the replayed request's answer
			// begins with it, and what follows is sent.
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name:     "stream_without_done",
			chatOnly: true,
			setup: func(t *testing.T) (provider, provider) {
				// The finish reason and the usage come, and then nothing:
				// no [DONE], and the connection stays open.
				return handWritten(t, primaryModel,
					play{name: "no done", stream: chatRole + chatHello + chatFinish + chatUsage + hold, json: chatAnswer},
				), scripted(t, secondaryModel)
			},
			// Answered at once, by the one request: a stream that waited
			// for [DONE] would be cut by StallTimeout and sent again.
			held: &outcome{by: primaryModel, requests: [2]int{1, 0}},
		},
		{
			name:     "stream_without_done_or_usage",
			chatOnly: true,
			setup: func(t *testing.T) (provider, provider) {
				// A provider that ignores include_usage: the finish reason,
				// then nothing, the connection left open.
				return handWritten(t, primaryModel,
					play{name: "no done", stream: chatRole + chatHello + chatFinish + hold, json: chatAnswer},
				), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{1, 0}},
		},
		{
			name:     "stream_without_done_closed",
			chatOnly: true,
			setup: func(t *testing.T) (provider, provider) {
				return handWritten(t, primaryModel,
					play{name: "no done", stream: chatRole + chatHello + chatFinish, json: chatAnswer},
				), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{1, 0}},
		},
		{
			name: "malformed_event_before_text",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.Malformed(), answerStep), scripted(t, secondaryModel)
			},
			// Nothing reached the client, so even the streaming gateway
			// sends it again.
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name: "stream_cut_before_text",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.StreamDrop(0), answerStep), scripted(t, secondaryModel)
			},
			held: &outcome{by: primaryModel, requests: [2]int{2, 0}},
		},
		{
			name: "context_length_exceeded",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.ContextLengthExceeded()), scripted(t, secondaryModel, answerStep)
			},
			// Not retried (the same prompt is too long again), failed over
			// at once to a model that may have a larger window.
			held: &outcome{by: secondaryModel, requests: [2]int{1, 1}},
		},
		{
			name: "content_filter",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.ContentFilter()), scripted(t, secondaryModel, answerStep)
			},
			// The refusal is kept: neither retried nor sent to a
			// provider whose filter may be weaker.
			held: &outcome{kind: llmretry.KindRefused, why: llmretry.WhyRefused, retryItem: false, requests: [2]int{1, 0}},
		},
		{
			name: "content_filter_finish",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, llmretrytest.Refuse("I cannot")), scripted(t, secondaryModel, answerStep)
			},
			// A 200 whose finish reason is content_filter: refused as the
			// 400 is, the words before it kept in the record.
			held: &outcome{kind: llmretry.KindRefused, why: llmretry.WhyRefused, retryItem: false, requests: [2]int{1, 0}},
			// The client already holds the words: the chain stops for
			// that, before the refusal's own rule is asked.
			streamed: &outcome{kind: llmretry.KindRefused, why: llmretry.WhyDelivered, retryItem: false, requests: [2]int{1, 0}},
		},
		{
			name: "fallback_rejects_prefill",
			setup: func(t *testing.T) (provider, provider) {
				// The secondary does not take an assistant prefill and
				// answers every request with a 400.
				return scripted(t, primaryModel, unavailable, unavailable, unavailable), scripted(t, secondaryModel, llmretrytest.Status(400))
			},
			// The secondary's 400 is tried once and does not mask the
			// primary's outage: the error keeps both, and advises that
			// the item may be run again later.
			held: &outcome{kind: llmretry.KindRejected, why: llmretry.WhyNotRetryable, retryItem: true, requests: [2]int{3, 1}},
		},
		{
			name: "primary_flaps",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, unavailable, answerStep, unavailable, answerStep, unavailable, answerStep), scripted(t, secondaryModel)
			},
			// Every call is answered by the primary after one retry; the
			// failures never come three in a row, so its breaker stays
			// closed.
			calls: 3,
			held:  &outcome{by: primaryModel, requests: [2]int{6, 0}},
		},
		{
			name: "failover_accounting",
			setup: func(t *testing.T) (provider, provider) {
				return scripted(t, primaryModel, unavailable, unavailable, unavailable), scripted(t, secondaryModel, answerStep, answerStep, answerStep)
			},
			// The first call spends the primary's tries and opens its
			// breaker; the next two skip it without a request.
			calls: 3,
			held:  &outcome{by: secondaryModel, requests: [2]int{3, 3}},
		},
	}
	for _, tc := range tests {
		for _, r := range allRows {
			if tc.chatOnly && r.responses() {
				continue
			}
			want := tc.held
			switch {
			case r.plain() && tc.plain != nil:
				want = tc.plain
			case r == rowRespStreamed && tc.respStreamed != nil:
				want = tc.respStreamed
			case r.streamed() && tc.streamed != nil:
				want = tc.streamed
			}
			t.Run(tc.name+"/"+r.String(), func(t *testing.T) {
				t.Parallel()
				primary, secondary := tc.setup(t)
				chain := gatewayChain(r, primary, secondary)
				var records []llmretry.Attempt
				chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) { records = append(records, a) }

				for call := range max(tc.calls, 1) {
					cur := &deltas{} // the client's side of the call
					first := len(records)
					ctx, cancel := context.WithTimeout(t.Context(), callDeadline)
					if r.streamed() {
						ctx = llmretry.WithStream(ctx, func(c llmretry.Chunk) { cur.emit("", c.Text) })
					}
					answer, err := chain.Do(ctx, "Why is the sky blue?")
					if ctx.Err() != nil {
						t.Fatalf("call %d: Do() = %v, want it to end before its deadline", call, err)
					}
					cancel()
					checkCall(t, call, r, want, answer, err, records[first:], strings.Join(cur.all(), ""))
				}
				checkAccounting(t, want, records, primary, secondary)
			})
		}
	}
}

const (
	primaryModel   = "gpt-primary"
	secondaryModel = "gpt-secondary"

	// stall is the backends' StallTimeout: short, so that a fault that
	// falls silent costs the suite little, and long enough that a
	// healthy stream on a machine loaded by -race and the package's other
	// tests (the conformance suite's thousands of streams) is not cut.
	stall = 400 * time.Millisecond
	// attemptTimeout is the plain backends' Timeout: long enough for a
	// slow first token (2*stall), short enough that a plain request that
	// gets no response is cut soon.
	attemptTimeout = 2 * time.Second
	// callDeadline bounds each call, as a client's request deadline
	// does; no fault may run into it.
	callDeadline = 10 * time.Second
)

// The gateway's policies, the README's interactive handler's scaled
// down: a few short waits, MaxTries, a Reserve, and a silent backend
// failed over after one try.
var (
	primaryPolicy   = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}, MaxTries: 3, Reserve: time.Second, FailOverSilent: true}
	secondaryPolicy = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}, MaxTries: 2, Reserve: time.Second, FailOverSilent: true}
)

var (
	answerStep  = llmretrytest.Answer("The sky is blue.")
	unavailable = llmretrytest.Status(503)
	// chatAnswer is a whole plain answer, for the hand-written faults'
	// Chat row.
	chatAnswer = `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-primary","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`
)

// gatewayRow is how the gateway talks to its providers.
type gatewayRow int

const (
	rowPlain        gatewayRow = iota // Chat: one JSON answer
	rowHeld                           // ChatStream with a nil emit: streamed, held until whole
	rowStreamed                       // ChatStream, each call streamed through to its client, replayed after a cut
	rowRespPlain                      // Responses
	rowRespHeld                       // ResponsesStream with a nil emit
	rowRespStreamed                   // ResponsesStream in the background, streamed through, resumed after a cut
)

var allRows = []gatewayRow{rowPlain, rowHeld, rowStreamed, rowRespPlain, rowRespHeld, rowRespStreamed}

func (r gatewayRow) String() string {
	return [...]string{"chat", "held_stream", "streamed", "responses", "responses_held_stream", "responses_streamed"}[r]
}

// plain reports whether r sends plain requests; streamed whether it
// passes the text through; responses whether it calls the Responses API.
func (r gatewayRow) plain() bool     { return r == rowPlain || r == rowRespPlain }
func (r gatewayRow) streamed() bool  { return r == rowStreamed || r == rowRespStreamed }
func (r gatewayRow) responses() bool { return r >= rowRespPlain }

// gatewayChain is the gateway's chain of the primary and the secondary,
// as the README recommends for an interactive handler in row r.
func gatewayChain(r gatewayRow, primary, secondary provider) *llmretry.Chain[string, llmretry.Completion] {
	return &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{
			gatewayBackend(r, primary.client, primaryModel, primaryPolicy),
			gatewayBackend(r, secondary.client, secondaryModel, secondaryPolicy),
		},
		// A streamed answer cut after text goes on from it; the client
		// speaks OpenAI's stream, which has no restart.
		Continue: r.streamed(),
	}
}

// gatewayBackend is a backend as the docs recommend configuring one for a
// caller who is waiting: retry policy p, a StallTimeout for a stream (its
// time to first output, and between outputs) and a Timeout for a plain
// request, a Breaker of its own, and for a stream passed through, the
// way its server continues an answer.
func gatewayBackend(r gatewayRow, client openai.Client, model string, p llmretry.Policy) llmretry.Backend[string, llmretry.Completion] {
	var b llmretry.Backend[string, llmretry.Completion]
	switch r {
	case rowPlain:
		b = openairetry.Chat(client, model, build)
	case rowHeld:
		b = openairetry.ChatStream(client, model, build, nil)
		b.StallTimeout = stall
	case rowStreamed:
		// A server whose support of a prefix the gateway does not know:
		// replayed, and taken up after what the client holds.
		b = openairetry.WithPrefix(openairetry.ChatStream(client, model, build, nil), openairetry.Replay)
		b.StallTimeout = stall
	case rowRespPlain:
		b = openairetry.Responses(client, model, buildResponses)
	case rowRespHeld:
		b = openairetry.ResponsesStream(client, model, buildResponses, nil)
		b.StallTimeout = stall
	case rowRespStreamed:
		b = openairetry.WithBackground(openairetry.ResponsesStream(client, model, buildResponses, nil))
		b.StallTimeout = stall
	}
	b.Retry = p
	if r.plain() {
		b.Timeout = attemptTimeout
	}
	b.Breaker = &llmretry.Breaker{Failures: 3, Cooldown: time.Minute}
	return b
}

// outcome is what a fault must come to in one row.
type outcome struct {
	by string // the model that answered every call; "" when the call fails
	// For a failed call: the Kind and Why of its last record, and what
	// RetryItem advises.
	kind      llmretry.Kind
	why       llmretry.Why
	retryItem bool
	// requests is how many requests the primary and the secondary
	// logged, over all calls.
	requests [2]int
	// hinted, when set, is the retry-after of the first record, which
	// must be the wait before the retry.
	hinted time.Duration
}

// checkCall checks one call's answer or error and its records against
// want. sent is the text the client was handed.
func checkCall(t *testing.T, call int, r gatewayRow, want *outcome, answer llmretry.Completion, err error, records []llmretry.Attempt, sent string) {
	t.Helper()
	if first := records[0]; want.hinted != 0 && (first.RetryAfter != want.hinted || first.RetryIn != want.hinted || first.Next != llmretry.NextRetry) {
		t.Errorf("call %d: first record = %v (retry-after %v), want a retry in the %v the server asked for", call, first, first.RetryAfter, want.hinted)
	}
	delivered := 0
	for _, a := range records {
		if a.Delivered {
			delivered++
		}
	}
	if !r.streamed() && (delivered > 0 || sent != "") {
		t.Errorf("call %d: %d records delivered, %q sent, want nothing delivered by a gateway that holds its answer", call, delivered, sent)
	}
	if want.by != "" {
		if err != nil {
			t.Fatalf("call %d: Do() error = %v, want an answer by %s", call, err, want.by)
		}
		last := records[len(records)-1]
		if last.Err != nil || last.Model != want.by {
			t.Errorf("call %d: last record = %v, want the answer of %s", call, last, want.by)
		}
		// The client is told which model answered it.
		if answer.Text == "" || answer.Model != want.by {
			t.Errorf("call %d: Do() = %q by %q, want an answer with text by %s", call, answer.Text, answer.Model, want.by)
		}
		// The client got the answer once: from the one attempt that
		// delivered it, or from attempts each of which continued what
		// the client held.
		if r.streamed() && (sent != answer.Text || delivered == 0) {
			t.Errorf("call %d: client was sent %q by %d attempts, want %q", call, sent, delivered, answer.Text)
		}
		first := true
		for _, a := range records {
			if !a.Delivered {
				continue
			}
			if !first && a.ContinuedFrom == 0 {
				t.Errorf("call %d: record %v delivered without continuing what the client held", call, a)
			}
			first = false
		}
		return
	}
	if err == nil {
		t.Fatalf("call %d: Do() = %q, want an error (%s, %s)", call, answer.Text, want.kind, want.why)
	}
	var ex *llmretry.Exhausted
	if !errors.As(err, &ex) {
		t.Fatalf("call %d: Do() error = %T %v, want an *llmretry.Exhausted (or a TimedOut)", call, err, err)
	}
	if len(ex.Attempts) != len(records) {
		t.Errorf("call %d: error has %d records, OnAttempt saw %d", call, len(ex.Attempts), len(records))
	}
	last := ex.Attempts[len(ex.Attempts)-1]
	if last.Kind != want.kind || last.Why != want.why || last.Next != llmretry.NextStop {
		t.Errorf("call %d: last record = %v (%s, %s), want %s, stop, %s", call, last, last.Kind, last.Why, want.kind, want.why)
	}
	if got := llmretry.RetryItem(err); got != want.retryItem {
		t.Errorf("call %d: RetryItem(%v) = %v, want %v", call, err, got, want.retryItem)
	}
	// Every backend that was tried is named in the error a person reads:
	// a fallback's own failure must not hide why the primary was left.
	for _, a := range ex.Attempts {
		if !strings.Contains(err.Error(), a.Model) {
			t.Errorf("call %d: Do() error = %q, want it to name %s", call, err, a.Model)
		}
	}
	switch {
	case r.streamed() && want.why == llmretry.WhyDelivered:
		// The client holds what the one delivering attempt sent, and
		// nothing was sent again.
		if delivered != 1 || last.RawText == nil || sent != *last.RawText || sent == "" {
			t.Errorf("call %d: client was sent %q by %d attempts, want the failed attempt's text %v, once", call, sent, delivered, last.RawText)
		}
	case sent != "":
		t.Errorf("call %d: client was sent %q, want nothing before an error", call, sent)
	}
}

// checkAccounting checks that each provider logged one request for every
// record of its backend that was not a skip, and as many as want says,
// and that the records' usage is what the provider told the client, the
// usage of failed attempts included: a gateway bills what it was billed.
func checkAccounting(t *testing.T, want *outcome, records []llmretry.Attempt, providers ...provider) {
	t.Helper()
	for i, p := range providers {
		var (
			tried []int
			usage []*llmretry.Usage
		)
		for _, a := range records {
			if a.Backend == i && !a.Skipped {
				tried = append(tried, a.Try)
				usage = append(usage, a.Usage)
			}
		}
		if p.usage != nil {
			if diff := cmp.Diff(p.usage(), usage); diff != "" {
				t.Errorf("%s: records' usage differs from the server's log (-log +records):\n%s", p.model, diff)
			}
		}
		logged := p.log()
		if len(logged) != len(tried) || len(logged) != want.requests[i] {
			t.Errorf("%s logged %d requests %q; records show %d (tries %v), want %d", p.model, len(logged), logged, len(tried), tried, want.requests[i])
		}
	}
}

// provider is one fault-injecting OpenAI-compatible server, for one
// model, and a client for it.
type provider struct {
	model  string
	client openai.Client
	log    func() []string // what the server played for each request, in order
	// usage is the usage the server told the client for each request, in
	// order; nil for a hand-written provider, which does not log it.
	usage func() []*llmretry.Usage
}

// scripted is a provider that llmretrytest plays, model's steps in order.
func scripted(t *testing.T, model string, steps ...llmretrytest.Step) provider {
	t.Helper()
	srv := newServer(t)
	srv.Script(model, steps...)
	return provider{model: model, client: newClient(srv), log: func() []string {
		var steps []string
		for _, r := range srv.Requests() {
			steps = append(steps, r.Step)
		}
		return steps
	}, usage: func() []*llmretry.Usage {
		var told []*llmretry.Usage
		for _, r := range srv.Requests() {
			var u *llmretry.Usage
			if r.Usage != nil {
				v := llmretry.Usage(*r.Usage)
				u = &v
			}
			told = append(told, u)
		}
		return told
	}}
}

// play is one hand-written response, for a fault llmretrytest has no
// step for: stream is the event stream sent to a streaming request, json
// the body sent to a plain one. Either may end with hold or cutOff, as
// for rawServer.
type play struct {
	name, stream, json string
	reset              bool // answer with a TCP reset instead, before any byte of a response
}

// handWritten is a provider that answers the n-th request (from 0) with
// plays[n], the last again once they run out.
func handWritten(t *testing.T, model string, plays ...play) provider {
	t.Helper()
	var (
		mu  sync.Mutex
		log []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Stream bool `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, `{"error":{"message":"bad body","type":"invalid_request_error"}}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		p := plays[min(len(log), len(plays)-1)]
		log = append(log, p.name)
		mu.Unlock()
		if p.reset {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			// A linger of 0 makes Close send RST rather than FIN.
			_ = conn.(*net.TCPConn).SetLinger(0)
			_ = conn.Close()
			return
		}
		body := p.json
		w.Header().Set("Content-Type", "application/json")
		if in.Stream {
			body = p.stream
			w.Header().Set("Content-Type", "text/event-stream")
		}
		body, held := strings.CutSuffix(body, hold)
		body, cut := strings.CutSuffix(body, cutOff)
		// The shared chunks name gpt-a; a provider names its own model.
		body = strings.ReplaceAll(body, `"model":"gpt-a"`, `"model":"`+model+`"`)
		_, _ = w.Write([]byte(body))
		w.(http.Flusher).Flush()
		if held {
			<-r.Context().Done()
		}
		if cut {
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(srv.Close)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(testKey))
	return provider{model: model, client: client, log: func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), log...)
	}}
}

// A gateway serves many clients at once: while the primary is down, the
// calls in flight together share its breaker, and however their requests
// interleave, each provider logged exactly one request per record that
// was not a skip, and every client got one answer, whole and once.
func TestGatewayConcurrentAccounting(t *testing.T) {
	t.Parallel()
	const clients = 8
	for _, r := range allRows {
		t.Run(r.String(), func(t *testing.T) {
			t.Parallel()
			// The last step repeats: the primary is down for good, the
			// secondary answers every request.
			primary, secondary := scripted(t, primaryModel, unavailable), scripted(t, secondaryModel, answerStep)
			var (
				mu      sync.Mutex
				records []llmretry.Attempt
			)
			chain := gatewayChain(r, primary, secondary)
			chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) {
				mu.Lock()
				defer mu.Unlock()
				records = append(records, a)
			}
			var wg sync.WaitGroup
			for i := range clients {
				q := "question " + string(rune('a'+i))
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), callDeadline)
					defer cancel()
					// Each call streams to its own client.
					var sent deltas
					if r.streamed() {
						ctx = llmretry.WithStream(ctx, func(c llmretry.Chunk) { sent.emit(q, c.Text) })
					}
					answer, err := chain.Do(ctx, q)
					if err != nil || answer.Model != secondaryModel {
						t.Errorf("Do(%q) = %q by %q, %v; want the secondary's answer", q, answer.Text, answer.Model, err)
						return
					}
					if got := strings.Join(sent.all(), ""); r.streamed() && got != answer.Text {
						t.Errorf("Do(%q): client was sent %q, want %q once", q, got, answer.Text)
					}
				})
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			tried := 0
			for _, a := range records {
				if a.Backend == 0 && !a.Skipped {
					tried++
				}
			}
			// Exact counts depend on how the calls interleave; the
			// records must agree with the logs whatever they are.
			checkAccounting(t, &outcome{requests: [2]int{tried, clients}}, records, primary, secondary)
			if tried > 3*clients || tried < 3 {
				t.Errorf("primary got %d requests, want at least the 3 that open its breaker and at most 3 per call", tried)
			}
		})
	}
}
