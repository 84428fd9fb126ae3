package llmretrytest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/llmretry/llmretry"
)

// MakeBackend returns the backend under test for [TestBackend]: one that
// sends each request for model to srv, built as a program builds it. The
// chain's request is the prompt. The backend's Retry, Timeout,
// StallTimeout and Breaker are the suite's to set; a streaming backend is
// returned without a consumer of its own (such as openairetry's emit), so
// that it holds its answer unless the call streams ([llmretry.WithStream]).
// Build its client with the SDK's own retries left as they are by
// default: the suite checks that every attempt sends one request
// whatever the client would do.
type MakeBackend func(srv *Server, model string) llmretry.Backend[string, llmretry.Completion]

// TestBackend checks a backend against the scripted provider, as
// testing/fstest.TestFS checks a file system: it builds the backend with
// makeBackend for a fresh [Server] in each subtest, scripts the server
// with a fault, runs a [llmretry.Chain] of the backend (and a second one
// to fail over to) and checks what the chain recorded against what the
// server logged. Each adapter under contrib/ runs it for every backend
// it offers, and a backend of your own gets the same checks, in a test of
// yours:
//
//	func TestBedrockBackend(t *testing.T) {
//		llmretrytest.TestBackend(t, func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
//			// The client as your program builds it (your middleware, your
//			// HTTP client), pointed at the scripted server, which speaks
//			// Anthropic's Messages API.
//			client := anthropic.NewClient(option.WithBaseURL(srv.AnthropicBaseURL()), option.WithAPIKey("test"), yourOptions...)
//			return anthropicretry.MessagesStream(client, model, build, nil)
//		})
//	}
//
// The backend may speak any of the server's APIs (OpenAI Chat
// Completions or Responses, Anthropic Messages, Gemini); the suite learns
// which from its first request, and whether it streams from
// [llmretry.Backend].Stream. It checks, in calls that do not stream and
// in calls that stream to a consumer of their own:
//
//   - every attempt sends one request, to the backend's model; the
//     records and the server's log agree request for request, in order,
//     on the model, the status (an error inside a stream that opened
//     with 200 is recorded with the status its type stands for: 529 for
//     overloaded_error, 500 for api_error and server_error, 429 for
//     rate_limit_error; Gemini's, the code its body gives) and the usage
//     the response told the client, failed attempts included; no record's
//     error holds the credential the client sent;
//   - the kind of each fault and what the chain does next: 5xx, 529,
//     hang-ups, cut and garbled bodies, streams that end unfinished or
//     report an error are transient and retried; a 429's retry-after is
//     recorded and waited; 4xx and a prompt too long are rejected and
//     failed over; an answer at its token budget is truncated with its
//     text; a refusal keeps its text and stops the chain (fails over with
//     FailOverRefused); an empty answer is a parse failure; a tool call
//     is an answer; a refused connection is transient; an attempt that
//     Timeout ends is a timeout whose error is [llmretry.ErrAttemptTimeout];
//   - an answer's text, model, stop reason, id and token counts, and the
//     Backend's Provider;
//   - the rate-limit headers of an answer, an error response and a
//     stream that fails inside reach the backend's Breaker, and a burst
//     of calls paced by them draws no 429 (not for Gemini, which sends
//     none; skipped with -short: it takes some 8 s);
//   - a streaming backend: StallTimeout cuts a stream that falls silent
//     before or after text, never one that keeps sending text or a tool
//     call's arguments; a call that streams gets every piece of text
//     through [llmretry.Emit] as it arrives, and a failure after that
//     ends the call with the text delivered, while a call that does not
//     stream gets the answer whole and has a broken stream sent again;
//   - a plain backend hands the whole answer to a call that streams.
//
// The subtests run in parallel, on real connections to 127.0.0.1; a few
// wait for stalls of half a second.
func TestBackend(t *testing.T, makeBackend MakeBackend) {
	t.Helper()
	srv := NewServer()
	defer srv.Close()
	srv.Script(modelA, Answer("Hello."))
	b := makeBackend(srv, modelA)
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{b}}
	if _, err := chain.Do(t.Context(), prompt); err != nil {
		t.Fatalf("llmretrytest: the backend's first request: Do() = %v, want an answer", err)
	}
	log := srv.Requests()
	if len(log) != 1 || log[0].Model != modelA {
		t.Fatalf("llmretrytest: the backend's first request: the server logged %v, want one request for %q", log, modelA)
	}
	kind := kindOf{api: log[0].API, stream: b.Stream, canContinue: b.CanContinue != nil}
	for _, c := range conformance {
		if c.streamOnly && !kind.stream || c.continues && !(kind.canContinue && kind.stream) {
			continue
		}
		if c.run != nil {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.run(t, kind, makeBackend)
			})
			continue
		}
		for _, streamed := range []bool{false, true} {
			if c.continues && !streamed {
				continue // nothing is delivered to continue from
			}
			k := kind
			k.streamed = streamed
			t.Run(c.name+"/"+k.String(), func(t *testing.T) {
				t.Parallel()
				c.check(t, k, k.play(t, makeBackend, c.play(k)))
			})
		}
	}
}

// The models the suite scripts: the chain's first backend, and the one it
// fails over to.
const (
	modelA = "model-a"
	modelB = "model-b"
	prompt = "Why is the sky blue?"
)

// stallTimeout is the StallTimeout of the stall cases: long enough that a
// loaded machine running -race still delivers a chunk within it, short
// enough for a quick suite.
const stallTimeout = 500 * time.Millisecond

// kindOf is how a subtest calls the backend.
type kindOf struct {
	api         string // the API the backend speaks, as Request.API names it
	stream      bool   // the backend asks for a stream
	canContinue bool   // the backend has a CanContinue
	streamed    bool   // the call streams (WithStream)
}

// resumes reports whether the backend continues by resuming a background
// response, which it cannot once the response failed, rather than by a
// prefix, which it can after any failure.
func (k kindOf) resumes() bool { return k.api == responsesAPI.name }

func (k kindOf) String() string {
	if k.streamed {
		return "streamed"
	}
	return "held"
}

// delivers reports whether text reaches the caller before the answer is
// whole: a streaming backend in a call that streams.
func (k kindOf) delivers() bool { return k.stream && k.streamed }

// overload is the error inside a stream, of the API's own type, that
// stands for an overloaded provider.
func (k kindOf) overload() string {
	switch k.api {
	case "anthropic":
		return "overloaded_error"
	case "gemini":
		return "UNAVAILABLE"
	}
	return "server_error"
}

// play is one subtest's setup.
type play struct {
	a, b            []Step          // the scripts of the chain's backends; no b is a chain of one
	policy          llmretry.Policy // a's; zero means two waits of a millisecond, unless once
	once            bool            // a gets one try
	timeout         time.Duration   // a's Timeout
	stall           time.Duration   // a's StallTimeout
	breaker         bool            // a gets a Breaker
	failOverRefused bool
	apart           bool // b on a server of its own, so that a's can go down
	continues       bool // the chain's Continue
	restart         bool // the chain's Restart
}

// suiteResult is what a subtest saw.
type suiteResult struct {
	answer  llmretry.Completion
	err     error
	records []llmretry.Attempt // as OnAttempt saw them
	chunks  []string           // the text of what the call's stream got
	stream  []heldChunk        // what the call's stream got, restarts included
	sent    int                // requests sent so far
	log     []Request          // every server's log, in the order they read the requests
	backend llmretry.Backend[string, llmretry.Completion]
}

// tiny is the policy of a subtest that does not set one: two retries, a
// millisecond apart.
var tiny = llmretry.Policy{Waits: []time.Duration{time.Millisecond, time.Millisecond}}

// play runs p: it starts the servers, builds the chain and makes one call,
// streamed or not as k says, and checks what every subtest checks.
func (k kindOf) play(t *testing.T, makeBackend MakeBackend, p play) suiteResult {
	t.Helper()
	srvA := NewServer()
	t.Cleanup(srvA.Close)
	srvA.Script(modelA, p.a...)
	servers := []*Server{srvA}
	a := makeBackend(srvA, modelA)
	a.Retry, a.Timeout, a.StallTimeout = p.policy, p.timeout, p.stall
	if len(p.policy.Waits) == 0 && !p.once {
		a.Retry = tiny
	}
	if p.breaker {
		a.Breaker = &llmretry.Breaker{}
	}
	backends := []llmretry.Backend[string, llmretry.Completion]{a}
	if p.b != nil {
		srvB := srvA
		if p.apart {
			srvB = NewServer()
			t.Cleanup(srvB.Close)
			servers = append(servers, srvB)
		}
		srvB.Script(modelB, p.b...)
		b := makeBackend(srvB, modelB)
		b.Retry = tiny
		backends = append(backends, b)
	}
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends:        backends,
		FailOverRefused: p.failOverRefused,
		Continue:        p.continues,
		Restart:         p.restart,
	}
	res := k.call(chain, servers)
	res.backend = a
	CheckLog(t, res.records, res.err, servers...)
	k.checkStream(t, res)
	checkHeld(t, res)
	return res
}

// call makes one call through chain, streamed as k says, and returns what
// it saw, with the servers' logs.
func (k kindOf) call(chain *llmretry.Chain[string, llmretry.Completion], servers []*Server) suiteResult {
	var res suiteResult
	chain.OnAttempt = func(_ context.Context, at llmretry.Attempt) { res.records = append(res.records, at) }
	chain.OnAttemptStart = func(ctx context.Context, _ int, _ string, _ int) context.Context {
		res.sent++
		return ctx
	}
	ctx := context.Background()
	if k.streamed {
		ctx = llmretry.WithStream(ctx, func(c llmretry.Chunk) {
			res.chunks = append(res.chunks, c.Text)
			res.stream = append(res.stream, heldChunk{sent: res.sent, Chunk: c})
		})
	}
	res.answer, res.err = chain.Do(ctx, prompt)
	for _, s := range servers {
		res.log = append(res.log, s.Requests()...)
	}
	slices.SortStableFunc(res.log, func(x, y Request) int { return x.Time.Compare(y.Time) })
	return res
}

// heldChunk is a chunk of a call's stream, with how many requests the
// call had sent when it came.
type heldChunk struct {
	sent int
	llmretry.Chunk
}

// assembled is the text a call's stream holds at its end: what came after
// its last restart.
func (res suiteResult) assembled() string {
	var b strings.Builder
	for _, c := range res.stream {
		if c.Restart {
			b.Reset()
		}
		b.WriteString(c.Text)
	}
	return b.String()
}

// checkHeld checks each request sent against what the caller held when it
// was sent: a request sent while the caller held part of the answer
// continued it, from as many bytes as it held, and its log says so (an
// Anthropic prefill leaves out the trailing white space), or began the
// answer again after the stream was told to restart; a request sent while
// the caller held nothing continued nothing.
func checkHeld(t testing.TB, res suiteResult) {
	t.Helper()
	var sent []llmretry.Attempt
	for _, a := range res.records {
		if !a.Skipped && !errors.Is(a.Err, syscall.ECONNREFUSED) {
			sent = append(sent, a)
		}
	}
	for i, a := range sent {
		var held strings.Builder
		restarted := false
		for _, c := range res.stream {
			if c.sent > i {
				break
			}
			if c.Restart {
				held.Reset()
				restarted = c.sent == i
			}
			held.WriteString(c.Text)
		}
		h := held.String()
		switch {
		case a.Restarted && !restarted:
			t.Errorf("request %d (%v) says it restarted, but the stream was not told", i+1, a)
		case !a.Restarted && restarted:
			t.Errorf("request %d (%v): the stream was told to restart, but the record does not say so", i+1, a)
		case a.ContinuedFrom != len(h) && (h != "" || a.ContinuedFrom != 0):
			t.Errorf("request %d (%v) continued from %d bytes, but the caller held %q", i+1, a, a.ContinuedFrom, h)
		}
		if i < len(res.log) {
			trim := func(s string) string { return strings.TrimRightFunc(s, unicode.IsSpace) }
			if got := res.log[i].Continues; got != "" && trim(got) != trim(h) {
				t.Errorf("request %d (%v): the server was asked to continue %q, but the caller held %q", i+1, a, got, h)
			}
		}
	}
}

// CheckLog checks that a chain's records and the servers' logs tell the
// same story, request for request, and reports with t.Errorf where they
// do not: the records of attempts that sent a request (not a skip, one
// whose connection was refused, or one whose error wraps
// [llmretry.ErrConfig], which the backend did not send) are as many as the requests the
// servers logged, and in the order the servers read them each is for the
// same model, carries the status its logged step stands for (an error
// inside a stream that opened with 200: the status its type stands for,
// as [TestBackend] says) and the usage the response told the client, and
// was sent while its attempt ran; no record's error holds a credential a
// request carried; and when err, what Do returned, is an
// [*llmretry.Exhausted] (or embeds one), its records are the failed
// ones. records are every record, successes included, as
// [llmretry.Chain].OnAttempt saw them.
func CheckLog(t testing.TB, records []llmretry.Attempt, err error, servers ...*Server) {
	t.Helper()
	var log []Request
	for _, s := range servers {
		log = append(log, s.Requests()...)
	}
	slices.SortStableFunc(log, func(x, y Request) int { return x.Time.Compare(y.Time) })
	var reached []llmretry.Attempt
	for _, a := range records {
		// A connection refused, or a request the backend found set up
		// wrong before sending it, never reached a server.
		if !a.Skipped && !errors.Is(a.Err, syscall.ECONNREFUSED) && !errors.Is(a.Err, llmretry.ErrConfig) {
			reached = append(reached, a)
		}
	}
	if len(reached) != len(log) {
		t.Errorf("the chain sent %d requests (%s), the servers logged %d (%s): want one request per attempt",
			len(reached), summaries(reached), len(log), steps(log))
	}
	// A few milliseconds of slack keep wall-clock steps from failing the
	// check that each request arrived while its attempt ran.
	const slack = 5 * time.Millisecond
	for i := range min(len(reached), len(log)) {
		a, r := reached[i], log[i]
		if a.Model != r.Model {
			t.Errorf("request %d: record of %s, log of %s", i+1, a.Model, r.Model)
		}
		if want := statusOf(r); a.Status != want {
			t.Errorf("request %d (%s): record's status %d, want %d", i+1, r.Step, a.Status, want)
		}
		// A request that continued may be sent as it was, the answer
		// taken up after what the caller holds (openairetry's Replay);
		// but one the server was asked to continue was a continuation.
		if a.ContinuedFrom == 0 && r.Continues != "" {
			t.Errorf("request %d (%s): the server was asked to continue %q, the record continued nothing", i+1, r.Step, r.Continues)
		}
		if !sameUsage(a.Usage, r.Usage) {
			t.Errorf("request %d (%s): record's usage %s, the server told the client %s", i+1, r.Step, usageString(a.Usage), usageString(r.Usage))
		}
		if r.Time.Before(a.Start.Add(-slack)) || r.Time.After(a.Start.Add(a.Elapsed+slack)) {
			t.Errorf("request %d arrived at %v, outside its attempt [%v, +%v]", i+1, r.Time, a.Start, a.Elapsed)
		}
	}
	for _, r := range log {
		for _, secret := range credentials(r.Header) {
			for _, a := range records {
				if a.Err != nil && strings.Contains(a.Err.Error(), secret) {
					t.Errorf("record %v: its error holds the credential the client sent", a)
				}
			}
		}
	}
	var ex *llmretry.Exhausted
	if errors.As(err, &ex) {
		var failed []llmretry.Attempt
		for _, a := range records {
			if a.Err != nil {
				failed = append(failed, a)
			}
		}
		same := len(failed) == len(ex.Attempts)
		for i := 0; same && i < len(failed); i++ {
			same = failed[i].String() == ex.Attempts[i].String() && failed[i].Err == ex.Attempts[i].Err
		}
		if !same {
			t.Errorf("Do()'s error has records %s, OnAttempt saw the failures %s", summaries(ex.Attempts), summaries(failed))
		}
	}
}

// checkStream checks what the call's stream got: nothing when the call
// does not stream; otherwise the answer, or the text of the attempt that
// delivered before the chain stopped, and only what an attempt that
// delivered had sent.
func (k kindOf) checkStream(t *testing.T, res suiteResult) {
	t.Helper()
	got := res.assembled()
	var want string
	switch {
	case !k.streamed:
	case res.err == nil:
		want = res.answer.Text
	case slices.ContainsFunc(res.records, func(a llmretry.Attempt) bool { return a.ContinuedFrom > 0 }):
		want = got // checkHeld checks each continuation
	default:
		if n := len(res.records); n > 0 && res.records[n-1].Why == llmretry.WhyDelivered && res.records[n-1].RawText != nil {
			want = *res.records[n-1].RawText
		}
	}
	if got != want {
		t.Errorf("the call's stream got %q, want %q", got, want)
	}
	for _, a := range res.records {
		if a.Delivered && !k.streamed {
			t.Errorf("record %v: Delivered in a call that does not stream", a)
		}
	}
}

// statusOf is the status a logged request's step stands for in its
// record: the HTTP status, or for an error inside a stream the status its
// type stands for; 0 for an answer or a broken connection.
func statusOf(r Request) int {
	if rest, ok := strings.CutPrefix(r.Step, "status "); ok {
		code, _, _ := strings.Cut(rest, " ")
		n, _ := strconv.Atoi(code)
		return n
	}
	typ, ok := strings.CutPrefix(r.Step, "stream error ")
	if _, fault, isFault := strings.Cut(r.Step, " error "); !ok && isFault {
		// An answer that failed inside its stream (FailAfter).
		typ, _, ok = strings.Cut(fault, " after ")
	}
	switch {
	case !ok:
		return 0
	case !r.Stream || r.API == gemini.name:
		// An HTTP error; Gemini's stream error carries its code.
		return statusForType(typ)
	}
	switch typ {
	case "overloaded_error":
		return 529
	case "api_error", "server_error":
		return http.StatusInternalServerError
	case "rate_limit_error":
		return http.StatusTooManyRequests
	}
	return 0
}

// credentials are the secrets a request's header carried.
func credentials(h http.Header) []string {
	var s []string
	for _, key := range []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key", "Api-Key"} {
		v := strings.TrimPrefix(h.Get(key), "Bearer ")
		if len(v) >= 4 {
			s = append(s, v)
		}
	}
	return s
}

func sameUsage(a, b *Usage) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func usageString(u *Usage) string {
	if u == nil {
		return "none"
	}
	return fmt.Sprintf("%+v", *u)
}

// summaries lists the records as summary writes them, for messages.
func summaries(as []llmretry.Attempt) string { return strings.Join(summary(as), ", ") }

// summary is each record as "a ok", or "a <kind> <next> [<why>]", with
// the model named by its last letter.
func summary(as []llmretry.Attempt) []string {
	var s []string
	for _, a := range as {
		name := strings.TrimPrefix(a.Model, "model-")
		if a.Err == nil {
			s = append(s, name+" ok")
			continue
		}
		line := name + " " + a.Kind.String() + " " + string(a.Next)
		if a.Why != "" {
			line += " " + string(a.Why)
		}
		s = append(s, line)
	}
	return s
}

func steps(log []Request) string {
	var s []string
	for _, r := range log {
		s = append(s, r.Model+" "+r.Step)
	}
	return strings.Join(s, ", ")
}

// wantRecords checks the records against want, as summary writes them.
func wantRecords(t *testing.T, res suiteResult, want ...string) {
	t.Helper()
	if got := summary(res.records); !slices.Equal(got, want) {
		t.Errorf("records:\n\tgot  %q\n\twant %q", got, want)
	}
}

// wantRaw checks that record i kept raw as its raw text.
func wantRaw(t *testing.T, res suiteResult, i int, raw string) {
	t.Helper()
	if i >= len(res.records) {
		return // wantRecords said so
	}
	if got := res.records[i].RawText; got == nil || *got != raw {
		t.Errorf("record %v: RawText %s, want %q", res.records[i], quoted(got), raw)
	}
}

func quoted(s *string) string {
	if s == nil {
		return "nil"
	}
	return strconv.Quote(*s)
}

// wantAnswer checks that the call was answered with text.
func wantAnswer(t *testing.T, res suiteResult, text string) {
	t.Helper()
	if res.err != nil || res.answer.Text != text {
		t.Errorf("Do() = %q, %v; want %q", res.answer.Text, res.err, text)
	}
}

// wantFailure checks that the call failed, with an *llmretry.Exhausted
// (or one of the errors that embed it).
func wantFailure(t *testing.T, res suiteResult) {
	t.Helper()
	if !errors.As(res.err, new(*llmretry.Exhausted)) {
		t.Errorf("Do() = %q, %v; want an *llmretry.Exhausted", res.answer.Text, res.err)
	}
}

// limited is st with OpenAI's rate-limit headers: 4 of 5 requests left.
func limited(st Step) Step {
	return st.WithHeader("X-Ratelimit-Limit-Requests", "5").
		WithHeader("X-Ratelimit-Remaining-Requests", "4").
		WithHeader("X-Ratelimit-Reset-Requests", "500ms")
}

// conformanceCase is one check of TestBackend: a call set up by play and
// checked by check, in a call that streams and in one that does not; or
// a check of its own, run, made once.
type conformanceCase struct {
	name       string
	streamOnly bool // only for a backend that streams
	continues  bool // only for a streaming backend that can continue, in a call that streams
	play       func(k kindOf) play
	check      func(t *testing.T, k kindOf, res suiteResult)
	run        func(t *testing.T, k kindOf, makeBackend MakeBackend)
}

// conformance is every check of TestBackend.
var conformance = []conformanceCase{
	{
		name: "answer",
		play: func(kindOf) play { return play{a: []Step{Answer("Hello there, friend.")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantRecords(t, res, "a ok")
			c := res.answer
			if c.Text != "Hello there, friend." || c.Model != modelA || c.StopReason == "" || c.ID == "" || c.InputTokens != 10 || c.OutputTokens != 3 {
				t.Errorf("Do() = %+v, want the text, the model %q, a stop reason, an id, 10 input and 3 output tokens", c, modelA)
			}
			want := []string{"Hello ", "there, ", "friend."}
			if !k.stream {
				want = []string{"Hello there, friend."} // whole, as it is returned
			}
			if k.streamed && !slices.Equal(res.chunks, want) {
				t.Errorf("the call's stream got %q, want %q", res.chunks, want)
			}
			if len(res.records) == 1 && res.records[0].Delivered != k.streamed {
				t.Errorf("answer's record: Delivered %v, want %v", res.records[0].Delivered, k.streamed)
			}
			if res.backend.Provider == "" {
				t.Error("Backend.Provider is empty, want the provider's name")
			}
		},
	},
	{
		name: "retries_then_answers",
		play: func(kindOf) play { return play{a: []Step{Status(503), Status(500), Answer("Hello there.")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "Hello there.")
			wantRecords(t, res, "a transient retry", "a transient retry", "a ok")
		},
	},
	{
		// The client keeps the SDK's own retries: unless the backend
		// turns them off, three attempts cost more than three requests,
		// which the log check counts.
		name: "one_request_per_attempt",
		play: func(kindOf) play { return play{a: []Step{Status(503)}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantFailure(t, res)
			wantRecords(t, res, "a transient retry", "a transient retry", "a transient stop waits_used")
		},
	},
	{
		name: "retry_after",
		play: func(kindOf) play {
			return play{a: []Step{Status(429).WithHeader("Retry-After-Ms", "300"), Answer("ok")}}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "ok")
			wantRecords(t, res, "a transient retry", "a ok")
			if len(res.records) > 0 && (res.records[0].RetryAfter != 300*time.Millisecond || res.records[0].RetryIn != 300*time.Millisecond) {
				t.Errorf("record %v: retry-after %v, retry in %v; want 300ms, as the server said", res.records[0], res.records[0].RetryAfter, res.records[0].RetryIn)
			}
			if len(res.log) == 2 && res.log[1].Time.Sub(res.log[0].Time) < 300*time.Millisecond {
				t.Errorf("the retry came %v after the 429, want 300ms or more", res.log[1].Time.Sub(res.log[0].Time))
			}
		},
	},
	{
		name: "retry_after_beyond_max_wait",
		play: func(kindOf) play {
			return play{
				a:      []Step{Status(429).WithHeader("Retry-After", "60")},
				b:      []Step{Answer("from b")},
				policy: llmretry.Policy{Waits: []time.Duration{time.Millisecond}, MaxWait: time.Second},
			}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "from b")
			wantRecords(t, res, "a transient fail_over max_wait", "b ok")
			if len(res.records) > 0 && res.records[0].RetryAfter != time.Minute {
				t.Errorf("record %v: retry-after %v, want 1m0s", res.records[0], res.records[0].RetryAfter)
			}
		},
	},
	{
		name: "overloaded",
		play: func(k kindOf) play {
			return play{a: []Step{Status(529), StreamError(k.overload()), Answer("ok")}}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "ok")
			wantRecords(t, res, "a transient retry", "a transient retry", "a ok")
		},
	},
	{
		name: "rejected",
		play: func(kindOf) play { return play{a: []Step{Status(400)}, b: []Step{Answer("from b")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "from b")
			wantRecords(t, res, "a rejected fail_over not_retryable", "b ok")
		},
	},
	{
		// No retry fixes a key, whatever the headers say.
		name: "unauthorized",
		play: func(kindOf) play { return play{a: []Step{Status(401)}, b: []Step{Answer("from b")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "from b")
			wantRecords(t, res, "a rejected fail_over not_retryable", "b ok")
		},
	},
	{
		name: "context_length",
		play: func(kindOf) play {
			return play{a: []Step{ContextLengthExceeded()}, b: []Step{ContextLengthExceeded()}}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantFailure(t, res)
			wantRecords(t, res, "a rejected fail_over not_retryable", "b rejected stop not_retryable")
			if llmretry.RetryItem(res.err) {
				t.Errorf("RetryItem(%v) = true, want false: every backend rejected the prompt", res.err)
			}
		},
	},
	{
		name: "insufficient_quota",
		play: func(kindOf) play {
			return play{a: []Step{InsufficientQuota(), Answer("ok")}, b: []Step{Answer("from b")}}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			if k.api == "anthropic" {
				// Anthropic has no such answer: a 429 like any other.
				wantRecords(t, res, "a transient retry", "a ok")
				return
			}
			wantRecords(t, res, "a rejected fail_over not_retryable", "b ok")
		},
	},
	{
		name: "truncated",
		play: func(kindOf) play {
			return play{a: []Step{Truncated("The answer is")}, b: []Step{Answer("from b")}}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			if k.delivers() {
				// The caller holds the words: the truncation is the
				// call's outcome.
				if !errors.As(res.err, new(*llmretry.Truncated)) {
					t.Errorf("Do() = %v, want an *llmretry.Truncated", res.err)
				}
				wantRecords(t, res, "a truncated stop delivered")
			} else {
				wantAnswer(t, res, "from b")
				wantRecords(t, res, "a truncated fail_over not_retryable", "b ok")
			}
			wantRaw(t, res, 0, "The answer is")
		},
	},
	{
		name: "refused",
		play: func(kindOf) play { return play{a: []Step{Refuse("I can't")}, b: []Step{Answer("from b")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantFailure(t, res)
			if k.delivers() {
				wantRecords(t, res, "a refused stop delivered")
			} else {
				wantRecords(t, res, "a refused stop refused")
			}
			wantRaw(t, res, 0, "I can't")
			if llmretry.RetryItem(res.err) {
				t.Errorf("RetryItem(%v) = true, want false: the same content is refused again", res.err)
			}
		},
	},
	{
		name: "refused_fails_over",
		play: func(kindOf) play {
			return play{a: []Step{Refuse("")}, b: []Step{Answer("from b")}, failOverRefused: true}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "from b")
			wantRecords(t, res, "a refused fail_over not_retryable", "b ok")
		},
	},
	{
		name: "content_filter",
		play: func(kindOf) play { return play{a: []Step{ContentFilter()}, b: []Step{Answer("from b")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			if k.api == "openai" || k.api == "openai-responses" {
				wantRecords(t, res, "a refused stop refused")
				return
			}
			// Others answer a plain 400.
			wantRecords(t, res, "a rejected fail_over not_retryable", "b ok")
		},
	},
	{
		name: "empty_answer",
		play: func(kindOf) play { return play{a: []Step{Answer(""), Answer("ok")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "ok")
			wantRecords(t, res, "a parse retry", "a ok")
		},
	},
	{
		name: "tool_call",
		play: func(kindOf) play { return play{a: []Step{ToolCall("get_weather", `{"city": "Paris"}`)}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "")
			wantRecords(t, res, "a ok")
			if res.answer.StopReason == "" || res.answer.Raw == nil {
				t.Errorf("Do() = %+v, want a stop reason and the provider's answer in Raw", res.answer)
			}
			if len(res.records) == 1 && res.records[0].Delivered {
				t.Error("a tool call's record has Delivered true, want false: it has no text")
			}
		},
	},
	{
		name: "broken",
		play: func(kindOf) play {
			return play{a: []Step{Hangup(), Malformed(), StreamDrop(0), Answer("ok")}, policy: llmretry.Policy{Waits: []time.Duration{0, 0, 0}}}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "ok")
			wantRecords(t, res, "a transient retry", "a transient retry", "a transient retry", "a ok")
		},
	},
	{
		name: "cut_after_text",
		play: func(kindOf) play { return play{a: []Step{StreamDrop(2), Answer("ok")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			switch {
			case k.delivers():
				// The caller holds two chunks: nothing is sent again.
				wantFailure(t, res)
				wantRecords(t, res, "a transient stop delivered")
				wantRaw(t, res, 0, "chunk1 chunk2 ")
			case k.stream:
				wantAnswer(t, res, "ok")
				wantRecords(t, res, "a transient retry", "a ok")
				wantRaw(t, res, 0, "chunk1 chunk2 ")
			default:
				// A JSON body cut halfway.
				wantAnswer(t, res, "ok")
				wantRecords(t, res, "a transient retry", "a ok")
			}
		},
	},
	{
		name: "unfinished",
		play: func(kindOf) play { return play{a: []Step{StreamUnfinished(2), Answer("ok")}} },
		check: func(t *testing.T, k kindOf, res suiteResult) {
			if k.delivers() {
				wantFailure(t, res)
				wantRecords(t, res, "a transient stop delivered")
			} else {
				wantAnswer(t, res, "ok")
				wantRecords(t, res, "a transient retry", "a ok")
			}
			wantRaw(t, res, 0, "chunk1 chunk2 ")
		},
	},
	{
		name: "connection_refused",
		play: func(kindOf) play {
			return play{a: []Step{Down()}, b: []Step{Answer("from b")}, apart: true}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "from b")
			wantRecords(t, res, "a transient retry", "a transient retry", "a transient fail_over waits_used", "b ok")
			for _, a := range res.records[1:min(3, len(res.records))] {
				if !errors.Is(a.Err, syscall.ECONNREFUSED) {
					t.Errorf("record %v: want a refused connection", a)
				}
			}
		},
	},
	{
		name: "timeout",
		play: func(kindOf) play {
			return play{a: []Step{StallHeaders(), Answer("ok")}, timeout: 300 * time.Millisecond}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "ok")
			wantRecords(t, res, "a timeout retry", "a ok")
			if len(res.records) > 0 && !errors.Is(res.records[0].Err, llmretry.ErrAttemptTimeout) {
				t.Errorf("record %v: error %v, want it to name llmretry.ErrAttemptTimeout, not the SDK's bare context error", res.records[0], res.records[0].Err)
			}
		},
	},
	{
		name: "rate_limits",
		play: func(k kindOf) play {
			return play{a: []Step{limited(Answer("Hello."))}, breaker: true, once: true}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantLimits(t, res)
		},
	},
	{
		name: "rate_limits_of_error",
		play: func(k kindOf) play {
			return play{a: []Step{limited(Status(500))}, breaker: true, once: true}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) { wantLimits(t, res) },
	},
	{
		name:       "rate_limits_of_stream_error",
		streamOnly: true,
		play: func(k kindOf) play {
			return play{a: []Step{limited(StreamError(k.overload()))}, breaker: true, once: true}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) { wantLimits(t, res) },
	},
	{name: "paced_burst", run: pacedBurst},
	continueAfter("cut", "transient", 0, func(s Step) Step { return s.DropAfter(3) }),
	continueAfter("stall", "timeout", stallTimeout, func(s Step) Step { return s.StallAfter(3) }),
	continueAfter("garble", "transient", 0, func(s Step) Step { return s.GarbleAfter(3) }),
	{
		// An error inside the stream: a prefix goes on from it; a
		// background response that failed cannot be resumed, and the
		// answer starts again.
		name: "continue_or_restart_after_error", continues: true,
		play: func(k kindOf) play {
			return play{a: []Step{Answer(story).FailAfter(3, k.overload()), Answer(story)}, continues: true, restart: true}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, story)
			wantRecords(t, res, "a transient retry", "a ok")
			if k.resumes() {
				if len(res.records) == 2 && !res.records[1].Restarted {
					t.Errorf("record %v: want the answer restarted", res.records[1])
				}
				return
			}
			wantContinued(t, res, 1, len("The sky is "))
		},
	},
	{
		// A continuation the backend cannot take goes to one that can.
		name: "continue_on_the_next_backend", continues: true,
		play: func(kindOf) play {
			return play{
				a:         []Step{Answer(story).DropAfter(3)},
				b:         []Step{Answer(story)},
				policy:    llmretry.Policy{Waits: []time.Duration{0}, MaxTries: 1},
				continues: true,
			}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			if k.resumes() {
				// Only a's own retry could resume its response.
				wantFailure(t, res)
				wantRecords(t, res, "a transient stop delivered")
				return
			}
			wantAnswer(t, res, story)
			wantRecords(t, res, "a transient fail_over waits_used", "b ok")
			wantContinued(t, res, 1, len("The sky is "))
		},
	},
	{name: "continuation_refused", continues: true, run: continuationRefused},
	{name: "random_cuts", continues: true, run: randomCuts},
	{
		name:       "stall_before_text",
		streamOnly: true,
		play: func(kindOf) play {
			return play{a: []Step{StreamStall(0), Answer("ok")}, stall: stallTimeout}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "ok")
			wantRecords(t, res, "a timeout retry", "a ok")
		},
	},
	{
		name:       "stall_after_text",
		streamOnly: true,
		play: func(kindOf) play {
			return play{a: []Step{StreamStall(2), Answer("ok")}, stall: stallTimeout}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			if k.delivers() {
				wantFailure(t, res)
				wantRecords(t, res, "a timeout stop delivered")
			} else {
				// Held chunks reached no one: tried again.
				wantAnswer(t, res, "ok")
				wantRecords(t, res, "a timeout retry", "a ok")
			}
			wantRaw(t, res, 0, "chunk1 chunk2 ")
			if len(res.records) > 0 && res.records[0].Elapsed < stallTimeout {
				t.Errorf("record %v: the stalled attempt took %v, want %v or more", res.records[0], res.records[0].Elapsed, stallTimeout)
			}
		},
	},
	{
		// Text keeps coming for longer than StallTimeout, but never
		// stops for that long.
		name:       "slow_but_steady",
		streamOnly: true,
		play: func(kindOf) play {
			return play{a: []Step{Answer("one two three four five six seven eight nine ten").Every(stallTimeout / 5)}, stall: stallTimeout}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "one two three four five six seven eight nine ten")
			wantRecords(t, res, "a ok")
		},
	},
	{
		// A tool call's arguments are progress, not text: a stream busy
		// with them is not cut, and delivers nothing.
		name:       "busy_with_a_tool_call",
		streamOnly: true,
		play: func(kindOf) play {
			return play{a: []Step{ToolCall("search", `{"query": "why is the sky blue on a clear day"}`).Every(stallTimeout / 3)}, stall: stallTimeout}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, "")
			wantRecords(t, res, "a ok")
		},
	},
}

// pacedBurst checks that a burst of concurrent calls larger than the
// provider's bucket, through a Breaker that paces by the headers the
// backend reports, draws no 429: every call is answered, and every request
// the chain sent is in the server's log. The 21 requests take some 8 s of
// real time (16 past the bucket's 5, at 2 a second); it counts, and
// asserts no timing. One call goes first, alone: a Breaker does not pace
// before its first report, so a cold burst would meet the bucket unpaced.
func pacedBurst(t *testing.T, k kindOf, makeBackend MakeBackend) {
	if k.api == gemini.name {
		t.Skip("Gemini sends no rate-limit headers to pace by")
	}
	if testing.Short() {
		t.Skip("takes some 8 s of real time")
	}
	srv := NewServer()
	t.Cleanup(srv.Close)
	srv.Script(modelA, Answer("Hello."))
	srv.Limit(modelA, Limits{Requests: Bucket{Rate: 2, Burst: 5}})
	b := makeBackend(srv, modelA)
	b.Breaker = &llmretry.Breaker{}
	var (
		mu   sync.Mutex
		sent int // attempts that sent a request, skips left out
	)
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{b},
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			if !a.Skipped {
				mu.Lock()
				sent++
				mu.Unlock()
			}
		},
	}
	if _, err := chain.Do(t.Context(), prompt); err != nil {
		t.Fatalf("Do() = %v, want an answer", err)
	}
	const burst = 20
	errs := make([]error, burst)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = chain.Do(t.Context(), prompt) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Errorf("Do() = %v, want every call answered", err)
	}
	log := srv.Requests()
	refused := 0
	for _, r := range log {
		if r.Step != "answer" {
			refused++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if refused != 0 {
		t.Errorf("server log: %d of %d requests not answered, want 0", refused, len(log))
	}
	if len(log) != sent || sent != burst+1 {
		t.Errorf("server logged %d requests, the chain sent %d; want %d each", len(log), sent, burst+1)
	}
}

// wantLimits checks that the response's rate-limit headers reached the
// backend's Breaker: 4 requests left, and when the next is admitted.
func wantLimits(t *testing.T, res suiteResult) {
	t.Helper()
	st := res.backend.Breaker.State()
	if st.Reported.IsZero() || st.Remaining != 4 || st.NextAdmission.IsZero() {
		t.Errorf("Breaker.State() = %+v, want a report of 4 remaining with a next admission", st)
	}
}

// story is the answer the continuation cases script.
const story = "The sky is blue because air scatters the blue of sunlight more than the red."

// wantContinued checks that record i continued from n bytes.
func wantContinued(t *testing.T, res suiteResult, i, n int) {
	t.Helper()
	if i < len(res.records) && res.records[i].ContinuedFrom != n {
		t.Errorf("record %v: continued from %d bytes, want %d", res.records[i], res.records[i].ContinuedFrom, n)
	}
}

// continuationRefused checks that a continuation the server refuses (a
// 400 to the request that carried it) is not the call's outcome: the
// answer starts again. A prefix or a prefill the server refused is not
// sent again by the same backend, in later calls too; a background
// response that cannot be resumed is that response's fault, not the
// backend's.
func continuationRefused(t *testing.T, k kindOf, makeBackend MakeBackend) {
	k.streamed = true
	srv := NewServer()
	t.Cleanup(srv.Close)
	srv.Script(modelA, Answer(story).DropAfter(3), Status(400), Answer(story), Answer(story).DropAfter(3), Answer(story))
	a := makeBackend(srv, modelA)
	a.Retry = llmretry.Policy{Waits: []time.Duration{0, 0, 0}}
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{a}, Continue: true, Restart: true}

	first := k.call(chain, []*Server{srv})
	wantAnswer(t, first, story)
	wantRecords(t, first, "a transient retry", "a rejected retry", "a ok")
	if len(first.records) == 3 {
		if r := first.records[1]; r.ContinuedFrom == 0 || !errors.Is(r.Err, llmretry.ErrCannotContinue) {
			t.Errorf("record %v: want a continuation whose error wraps llmretry.ErrCannotContinue", r)
		}
		if r := first.records[2]; !r.Restarted {
			t.Errorf("record %v: want the answer restarted", r)
		}
	}
	checkHeld(t, first)
	if got := first.assembled(); got != story {
		t.Errorf("the call's stream assembled %q, want %q", got, story)
	}

	second := k.call(chain, []*Server{srv})
	wantAnswer(t, second, story)
	if k.resumes() {
		// A new response can be resumed.
		wantRecords(t, second, "a transient retry", "a ok")
		wantContinued(t, second, 1, len("The sky is "))
	} else {
		// Learned: the backend is not sent another prefix, and the answer
		// starts again at once.
		wantRecords(t, second, "a transient retry", "a ok")
		if len(second.records) == 2 && !second.records[1].Restarted {
			t.Errorf("record %v: want the answer restarted, with no second continuation", second.records[1])
		}
	}
	records := append(slices.Clone(first.records), second.records...)
	CheckLog(t, records, nil, srv)
}

// randomCuts plays streams cut at random points, each a random answer
// cut, garbled, failed inside or stalled zero to three times, through a
// chain that continues and restarts: every call ends in the whole answer,
// what its stream assembled is that answer, and the records and the
// server's log agree request for request. It plays 1,000 streams, 100
// with -short.
func randomCuts(t *testing.T, k kindOf, makeBackend MakeBackend) {
	k.streamed = true
	streams := 1000
	if testing.Short() {
		streams = 100
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	words := strings.Fields("the sky is blue because air scatters short waves of sunlight more than long ones so we see blue overhead and red at dusk")
	var (
		wg   sync.WaitGroup
		next = make(chan int)
	)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				rng := rand.New(rand.NewPCG(seed, uint64(i)))
				n := 5 + rng.IntN(20)
				var b strings.Builder
				for j := range n {
					if j > 0 {
						b.WriteString(" ")
					}
					b.WriteString(words[rng.IntN(len(words))])
				}
				text := b.String()
				var script []Step
				for range rng.IntN(4) {
					at := rng.IntN(5)
					// A stall costs the StallTimeout of real time: one
					// fault in eight.
					switch f := rng.IntN(8); {
					case f < 3:
						script = append(script, Answer(text).DropAfter(at))
					case f < 5:
						script = append(script, Answer(text).GarbleAfter(at))
					case f < 7:
						script = append(script, Answer(text).FailAfter(at, k.overload()))
					default:
						script = append(script, Answer(text).StallAfter(at))
					}
				}
				script = append(script, Answer(text))
				randomCut(prefixed{t, fmt.Sprintf("stream %d (seed %d) %v: ", i, seed, script)}, k, makeBackend, script, text)
			}
		})
	}
	for i := range streams {
		next <- i
	}
	close(next)
	wg.Wait()
}

// randomCut plays one stream of randomCuts: script, whose answer is text.
func randomCut(t testing.TB, k kindOf, makeBackend MakeBackend, script []Step, text string) {
	srv := NewServer()
	defer srv.Close()
	srv.Script(modelA, script...)
	a := makeBackend(srv, modelA)
	// More tries than faults, and a StallTimeout long enough that a
	// loaded machine running -race does not stall a healthy stream: such
	// a stall could cut a request before the server logged it, and the
	// records and the log would rightly disagree.
	a.Retry = llmretry.Policy{Waits: slices.Repeat([]time.Duration{0}, len(script)+3)}
	a.StallTimeout = time.Second
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{a}, Continue: true, Restart: true}
	res := k.call(chain, []*Server{srv})
	if res.err != nil || res.answer.Text != text {
		t.Errorf("Do() = %q, %v; want the whole answer %q (records %s)", res.answer.Text, res.err, text, summaries(res.records))
	}
	if got := res.assembled(); got != text {
		t.Errorf("the call's stream assembled %q, want %q", got, text)
	}
	CheckLog(t, res.records, res.err, srv)
	checkHeld(t, res)
}

// prefixed is a testing.TB whose messages say which of many checks made
// them.
type prefixed struct {
	testing.TB
	prefix string
}

func (p prefixed) Errorf(format string, args ...any) {
	p.TB.Helper()
	p.TB.Errorf("%s"+format, append([]any{p.prefix}, args...)...)
}

// continueAfter is the case of an answer that breaks after three chunks
// as brk says, a failure of kind, and is continued from them on the
// backend's retry; stall is the backend's StallTimeout.
func continueAfter(name, kind string, stall time.Duration, brk func(Step) Step) conformanceCase {
	return conformanceCase{
		name: "continue_after_" + name, continues: true,
		play: func(kindOf) play {
			return play{a: []Step{brk(Answer(story)), Answer(story)}, continues: true, stall: stall}
		},
		check: func(t *testing.T, k kindOf, res suiteResult) {
			wantAnswer(t, res, story)
			wantRecords(t, res, "a "+kind+" retry", "a ok")
			wantContinued(t, res, 1, len("The sky is "))
		},
	}
}
