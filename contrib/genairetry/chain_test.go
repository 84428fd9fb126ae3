package genairetry_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
	"github.com/llmretry/llmretry/llmretrytest"
	"google.golang.org/genai"
)

// These tests put a real genai.Client behind a Chain and talk to a
// scripted provider over loopback, so what they check is what the SDK
// and the chain do together on the wire.

// fakeKey is shaped like a real key, so that a test would see it if it
// leaked into a message.
const fakeKey = "AIzaSyTest0123456789abcdefghijklmnopq"

// tiny is the wait between tries: short enough for quick tests, and never
// asserted on.
var tiny = llmretry.Policy{Waits: []time.Duration{time.Millisecond, time.Millisecond}}

func newServer(t *testing.T) *llmretrytest.Server {
	t.Helper()
	srv := llmretrytest.NewServer()
	t.Cleanup(srv.Close)
	return srv
}

// newClient is a client as a user builds one, with the package's
// Transport and with the SDK's retries turned on (five attempts, its
// default once asked for), to show that the Backends turn them off.
func newClient(t *testing.T, srv *llmretrytest.Server) *genai.Client {
	t.Helper()
	return clientAt(t, srv.GeminiBaseURL(), genairetry.Transport(nil))
}

func clientAt(t *testing.T, baseURL string, rt http.RoundTripper) *genai.Client {
	t.Helper()
	client, err := genai.NewClient(t.Context(), &genai.ClientConfig{
		APIKey:  fakeKey,
		Backend: genai.BackendGeminiAPI,
		HTTPOptions: genai.HTTPOptions{
			BaseURL:      baseURL,
			RetryOptions: &genai.HTTPRetryOptions{},
		},
		HTTPClient: &http.Client{Transport: rt},
	})
	if err != nil {
		t.Fatalf("genai.NewClient() = %v", err)
	}
	return client
}

// build makes the request.
func build(prompt string) ([]*genai.Content, *genai.GenerateContentConfig) {
	return genai.Text(prompt), &genai.GenerateContentConfig{MaxOutputTokens: 1024}
}

// mode is how a test's Backends call the API.
type mode struct {
	name   string
	stream bool
	emit   bool // a stream hands its text to an emit; else it buffers
}

var (
	jsonMode     = mode{"json", false, false}
	streamMode   = mode{"stream", true, true}
	bufferedMode = mode{"buffered", true, false}
	modes        = []mode{jsonMode, streamMode, bufferedMode}
)

// backend returns a Backend for model in mode m, with the text streamed to
// it appended to *emitted.
func (m mode) backend(client *genai.Client, model string, policy llmretry.Policy, emitted *[]string) llmretry.Backend[string, llmretry.Completion] {
	var b llmretry.Backend[string, llmretry.Completion]
	switch {
	case m.stream && m.emit:
		b = genairetry.GenerateContentStream(client, model, build, func(_ string, delta string) {
			if emitted != nil {
				*emitted = append(*emitted, delta)
			}
		})
	case m.stream:
		b = genairetry.GenerateContentStream(client, model, build, nil)
	default:
		b = genairetry.GenerateContent(client, model, build)
	}
	b.Retry = policy
	return b
}

// run sends one prompt through a chain of backends and returns the answer,
// every attempt's record (the successful one included) and the error.
func run(ctx context.Context, backends ...llmretry.Backend[string, llmretry.Completion]) (llmretry.Completion, []llmretry.Attempt, error) {
	var records []llmretry.Attempt
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends:  backends,
		OnAttempt: func(_ context.Context, a llmretry.Attempt) { records = append(records, a) },
	}
	answer, err := chain.Do(ctx, "Say hello.")
	return answer, records, err
}

// sent is what a record and a log entry both say about one request.
type sent struct {
	Model  string
	Status int
	Usage  *llmretry.Usage // what the response told the client it cost
}

// matchLog checks that the chain's records and the servers' logs tell the
// same story, request for request: the same number of requests, in the
// same order, to the same models, with the statuses the scripted steps
// stand for and the usage each response told, each received while its
// attempt was under way. Attempts
// that never reached a server (a refused connection) are left out. When
// err is a chain error, its records must be the failed ones.
func matchLog(t *testing.T, records []llmretry.Attempt, err error, servers ...*llmretrytest.Server) {
	t.Helper()
	var log []llmretrytest.Request
	for _, srv := range servers {
		log = append(log, srv.Requests()...)
	}
	slices.SortStableFunc(log, func(a, b llmretrytest.Request) int { return a.Time.Compare(b.Time) })

	var reached []llmretry.Attempt
	for _, a := range records {
		if !errors.Is(a.Err, syscall.ECONNREFUSED) {
			reached = append(reached, a)
		}
	}
	var got, want []sent
	for _, a := range reached {
		got = append(got, sent{a.Model, a.Status, a.Usage})
	}
	for _, r := range log {
		var u *llmretry.Usage
		if r.Usage != nil {
			u = new(llmretry.Usage(*r.Usage))
		}
		want = append(want, sent{r.Model, statusOf(t, r), u})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records and server log differ (-log +records):\n%s", diff)
	}
	// Each request arrived while its attempt ran: the log and the records
	// are the same requests, not merely as many. A few milliseconds of
	// slack keep wall-clock steps from failing the test.
	const slack = 5 * time.Millisecond
	for i := range min(len(reached), len(log)) {
		a, r := reached[i], log[i]
		if r.Time.Before(a.Start.Add(-slack)) || r.Time.After(a.Start.Add(a.Elapsed+slack)) {
			t.Errorf("request %d arrived at %v, outside its attempt [%v, +%v]", i, r.Time, a.Start, a.Elapsed)
		}
	}

	var exhausted *llmretry.Exhausted
	if errors.As(err, &exhausted) {
		var failed []llmretry.Attempt
		for _, a := range records {
			if a.Err != nil {
				failed = append(failed, a)
			}
		}
		if diff := cmp.Diff(failed, exhausted.Attempts, cmp.Comparer(sameError)); diff != "" {
			t.Errorf("error's attempts and OnAttempt's records differ (-OnAttempt +error):\n%s", diff)
		}
	}
}

func sameError(a, b error) bool { return a == b }

// statusOf is the status a logged request's step stands for in a record:
// the HTTP status, or for an error inside a stream the code its body
// gives; 0 for an answer or a broken connection.
func statusOf(t *testing.T, r llmretrytest.Request) int {
	t.Helper()
	if rest, ok := strings.CutPrefix(r.Step, "status "); ok {
		code, _, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(code)
		if err != nil {
			t.Fatalf("log step %q: %v", r.Step, err)
		}
		return n
	}
	if typ, ok := strings.CutPrefix(r.Step, "stream error "); ok {
		return map[string]int{"UNAVAILABLE": 503, "INTERNAL": 500, "RESOURCE_EXHAUSTED": 429, "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400}[typ]
	}
	return 0
}

// kinds lists the records' kinds, for a compact comparison.
func kinds(records []llmretry.Attempt) []string {
	var ks []string
	for _, a := range records {
		k := "ok"
		if a.Err != nil {
			k = a.Kind.String()
		}
		ks = append(ks, a.Model+" "+k)
	}
	return ks
}

func checkKinds(t *testing.T, records []llmretry.Attempt, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, kinds(records)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

func TestRetriesThenAnswers(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.Status(503), llmretrytest.Status(500), llmretrytest.Answer("Hello there, friend."))
			var emitted []string
			answer, records, err := run(t.Context(), m.backend(newClient(t, srv), "gemini-a", tiny, &emitted))
			if err != nil {
				t.Fatalf("Do() = %v, want an answer", err)
			}
			resp, ok := answer.Raw.(*genai.GenerateContentResponse)
			if !ok {
				t.Fatalf("Completion.Raw = %T, want *genai.GenerateContentResponse", answer.Raw)
			}
			if resp.ResponseID != "resp_gemini-a_3" || resp.Text() != "Hello there, friend." {
				t.Errorf("Completion.Raw = id %q, text %q; want the third request's whole answer", resp.ResponseID, resp.Text())
			}
			answer.Raw = nil // the SDK's types hold headers; checked above
			want := llmretry.Completion{
				ID: "resp_gemini-a_3", Model: "gemini-a", Text: "Hello there, friend.", StopReason: "STOP",
				InputTokens: 10, OutputTokens: 3,
			}
			if diff := cmp.Diff(want, answer); diff != "" {
				t.Errorf("Do() answer (-want +got):\n%s", diff)
			}
			if m.emit {
				if diff := cmp.Diff([]string{"Hello ", "there, ", "friend."}, emitted); diff != "" {
					t.Errorf("emitted (-want +got):\n%s", diff)
				}
			}
			checkKinds(t, records, "gemini-a transient", "gemini-a transient", "gemini-a ok")
			if got := len(srv.Requests()); got != 3 {
				t.Errorf("server got %d requests, want 3", got)
			}
			if got, want := records[2].Delivered, m.emit; got != want {
				t.Errorf("answer's Delivered = %v, want %v", got, want)
			}
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 3}, records[2].Usage); diff != "" {
				t.Errorf("answer's Usage (-want +got):\n%s", diff)
			}
			if msg := records[0].Err.Error(); !strings.Contains(msg, "UNAVAILABLE") || !strings.Contains(msg, "overloaded") {
				t.Errorf("record error %q, want Google's status name and message", msg)
			}
			for _, a := range records {
				if a.Err != nil && strings.Contains(a.Err.Error(), fakeKey) {
					t.Errorf("record error %q holds the API key", a.Err)
				}
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestOneRequestPerAttempt(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.Status(503)) // forever
			// The client asks the SDK for its retries, five attempts per
			// request; unless the Backend turns them off, three attempts
			// cost fifteen requests.
			_, records, err := run(t.Context(), m.backend(newClient(t, srv), "gemini-a", tiny, nil))
			if err == nil {
				t.Fatal("Do() = nil error, want the 503s")
			}
			if got := len(srv.Requests()); got != 3 {
				t.Errorf("server got %d requests for 3 attempts, want 3", got)
			}
			checkKinds(t, records, "gemini-a transient", "gemini-a transient", "gemini-a transient")
			matchLog(t, records, err, srv)
		})
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		step llmretrytest.Step
		rt   http.RoundTripper // the client's transport
		want time.Duration
	}{
		// The body's RetryInfo needs no Transport: the SDK passes it on.
		{"retry_info", llmretrytest.RetryDelay(300 * time.Millisecond), http.DefaultTransport, 300 * time.Millisecond},
		// A header only the Transport shows the Backend.
		{"header", llmretrytest.Status(429).WithHeader("Retry-After", "1"), genairetry.Transport(nil), time.Second},
		// Both: the longer wins, so no request is early by either.
		{"both", llmretrytest.RetryDelay(300*time.Millisecond).WithHeader("Retry-After", "1"), genairetry.Transport(nil), time.Second},
	}
	for _, tc := range tests {
		for _, m := range modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gemini-a", tc.step, llmretrytest.Answer("ok"))
				client := clientAt(t, srv.GeminiBaseURL(), tc.rt)
				_, records, err := run(t.Context(), m.backend(client, "gemini-a", tiny, nil))
				if err != nil {
					t.Fatalf("Do() = %v, want an answer", err)
				}
				log := srv.Requests()
				if len(log) != 2 {
					t.Fatalf("server got %d requests, want 2", len(log))
				}
				if gap := log[1].Time.Sub(log[0].Time); gap < tc.want {
					t.Errorf("retry sent %v after the 429, want >= %v", gap, tc.want)
				}
				if got := records[0].RetryAfter; got != tc.want {
					t.Errorf("record RetryAfter = %v, want %v", got, tc.want)
				}
				checkKinds(t, records, "gemini-a transient", "gemini-a ok")
				matchLog(t, records, err, srv)
			})
		}
	}
}

func TestRetryAfterBeyondMaxWaitFailsOver(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.RetryDelay(22*time.Second))
			srv.Script("gemini-b", llmretrytest.Answer("from b"))
			client := newClient(t, srv)
			policy := llmretry.Policy{Waits: []time.Duration{time.Millisecond}, MaxWait: time.Second}
			answer, records, err := run(t.Context(),
				m.backend(client, "gemini-a", policy, nil),
				m.backend(client, "gemini-b", tiny, nil))
			if err != nil {
				t.Fatalf("Do() = %v, want b's answer", err)
			}
			if answer.Text != "from b" {
				t.Errorf("answer = %q, want %q", answer.Text, "from b")
			}
			checkKinds(t, records, "gemini-a transient", "gemini-b ok")
			if got := records[0]; got.Why != llmretry.WhyMaxWait || got.RetryAfter != 22*time.Second {
				t.Errorf("a's record says why %q, retry-after %v; want %q, 22s", got.Why, got.RetryAfter, llmretry.WhyMaxWait)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestOverloadedRetried(t *testing.T) {
	t.Parallel()
	steps := []llmretrytest.Step{
		llmretrytest.Status(503), llmretrytest.Status(500), llmretrytest.Status(429),
		llmretrytest.StreamError("UNAVAILABLE"), llmretrytest.StreamError("INTERNAL"),
	}
	for _, m := range modes {
		for _, step := range steps {
			t.Run(m.name+"/"+strings.ReplaceAll(step.String(), " ", "_"), func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gemini-a", step, llmretrytest.Answer("ok"))
				_, records, err := run(t.Context(), m.backend(newClient(t, srv), "gemini-a", tiny, nil))
				if err != nil {
					t.Fatalf("Do() = %v, want an answer after one retry", err)
				}
				checkKinds(t, records, "gemini-a transient", "gemini-a ok")
				matchLog(t, records, err, srv)
			})
		}
	}
}

// A spent daily quota and a prompt too long fail over at once: no retry
// on the same backend can help.
func TestRejectedFailsOverAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		step llmretrytest.Step
		msg  string // in the record's error
	}{
		{"daily_quota", llmretrytest.InsufficientQuota(), "daily quota GenerateRequestsPerDayPerProjectPerModel-FreeTier is spent; retrying within the call cannot help"},
		{"context_length", llmretrytest.ContextLengthExceeded(), "INVALID_ARGUMENT: The input token count"},
		{"failed_precondition", llmretrytest.StreamError("FAILED_PRECONDITION"), "FAILED_PRECONDITION"},
	}
	for _, tc := range tests {
		for _, m := range modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gemini-a", tc.step)
				srv.Script("gemini-b", llmretrytest.Answer("from b"))
				client := newClient(t, srv)
				answer, records, err := run(t.Context(),
					m.backend(client, "gemini-a", tiny, nil),
					m.backend(client, "gemini-b", tiny, nil))
				if err != nil || answer.Text != "from b" {
					t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
				}
				checkKinds(t, records, "gemini-a rejected", "gemini-b ok")
				if msg := records[0].Err.Error(); !strings.Contains(msg, tc.msg) {
					t.Errorf("record error %q, want it to say %q", msg, tc.msg)
				}
				if tc.name == "daily_quota" {
					// Gemini sends a RetryInfo with a spent daily quota;
					// the record must not pass it on as a hint.
					if records[0].RetryAfter != 0 {
						t.Errorf("daily quota's RetryAfter = %v, want 0", records[0].RetryAfter)
					}
					var q *genairetry.DailyQuota
					if !errors.As(records[0].Err, &q) || q.QuotaID != "GenerateRequestsPerDayPerProjectPerModel-FreeTier" {
						t.Errorf("errors.As(record, *DailyQuota) = %v, want the quota", q)
					}
				}
				var apiErr genai.APIError
				if !errors.As(records[0].Err, &apiErr) {
					t.Errorf("errors.As(%v, genai.APIError) = false, want the SDK's error beneath", records[0].Err)
				}
				matchLog(t, records, err, srv)
			})
		}
	}
}

func TestContextLengthEverywhere(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("gemini-a", llmretrytest.ContextLengthExceeded())
	srv.Script("gemini-b", llmretrytest.ContextLengthExceeded())
	client := newClient(t, srv)
	_, records, err := run(t.Context(), jsonMode.backend(client, "gemini-a", tiny, nil), jsonMode.backend(client, "gemini-b", tiny, nil))
	if !errors.As(err, new(*llmretry.Exhausted)) {
		t.Fatalf("Do() = %v, want an *llmretry.Exhausted", err)
	}
	checkKinds(t, records, "gemini-a rejected", "gemini-b rejected")
	if llmretry.RetryItem(err) {
		t.Errorf("RetryItem(%v) = true, want false: every backend rejected the prompt as too long", err)
	}
	matchLog(t, records, err, srv)
}

func TestTruncationKeepsPartialText(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.Truncated("The answer is"))
			srv.Script("gemini-b", llmretrytest.Answer("from b"))
			client := newClient(t, srv)
			answer, records, err := run(t.Context(),
				m.backend(client, "gemini-a", tiny, nil),
				m.backend(client, "gemini-b", tiny, nil))
			if m.emit {
				// The caller already holds the streamed words, so the
				// truncation is the chain's answer: nothing else is tried.
				if !errors.As(err, new(*llmretry.Truncated)) {
					t.Fatalf("Do() = %v, want an *llmretry.Truncated", err)
				}
				checkKinds(t, records, "gemini-a truncated")
				if !records[0].Delivered {
					t.Error("truncated stream's Delivered = false, want true")
				}
			} else {
				if err != nil || answer.Text != "from b" {
					t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
				}
				checkKinds(t, records, "gemini-a truncated", "gemini-b ok")
			}
			if raw := records[0].RawText; raw == nil || *raw != "The answer is" {
				t.Errorf("truncated record's RawText = %v, want %q", raw, "The answer is")
			}
			// A truncated answer is billed.
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 3}, records[0].Usage); diff != "" {
				t.Errorf("truncated record's Usage (-want +got):\n%s", diff)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestStreamCutAfterTextIsNotResent(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("gemini-a", llmretrytest.StreamDrop(2))
	srv.Script("gemini-b", llmretrytest.Answer("from b"))
	client := newClient(t, srv)
	var emitted []string
	_, records, err := run(t.Context(),
		streamMode.backend(client, "gemini-a", tiny, &emitted),
		streamMode.backend(client, "gemini-b", tiny, nil))
	if err == nil {
		t.Fatal("Do() = nil error, want the cut stream's")
	}
	checkKinds(t, records, "gemini-a transient")
	if !records[0].Delivered {
		t.Error("cut stream's Delivered = false, want true")
	}
	if raw := records[0].RawText; raw == nil || *raw != "chunk1 chunk2 " {
		t.Errorf("cut stream's RawText = %v, want %q", raw, "chunk1 chunk2 ")
	}
	if diff := cmp.Diff([]string{"chunk1 ", "chunk2 "}, emitted); diff != "" {
		t.Errorf("emitted (-want +got):\n%s", diff)
	}
	// Each chunk counts the usage so far; the cut stream was billed for
	// two.
	if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 2}, records[0].Usage); diff != "" {
		t.Errorf("cut stream's Usage (-want +got):\n%s", diff)
	}
	matchLog(t, records, err, srv)
}

func TestStreamCutBeforeTextIsRetried(t *testing.T) {
	t.Parallel()
	for _, m := range []mode{streamMode, bufferedMode} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.StreamDrop(0), llmretrytest.Answer("ok"))
			answer, records, err := run(t.Context(), m.backend(newClient(t, srv), "gemini-a", tiny, nil))
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
			}
			checkKinds(t, records, "gemini-a transient", "gemini-a ok")
			if records[0].Delivered {
				t.Error("stream cut before text has Delivered = true, want false")
			}
			matchLog(t, records, err, srv)
		})
	}
}

// A buffered stream hands the caller nothing until it is whole, so one
// cut after some text is sent again: here on the same backend, and when
// its retries are spent, on the next.
func TestBufferedStreamCutAfterProgressIsResent(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("gemini-a", llmretrytest.StreamDrop(2), llmretrytest.StreamUnfinished(3), llmretrytest.StreamDrop(1))
	srv.Script("gemini-b", llmretrytest.Answer("from b"))
	client := newClient(t, srv)
	answer, records, err := run(t.Context(),
		bufferedMode.backend(client, "gemini-a", tiny, nil),
		bufferedMode.backend(client, "gemini-b", tiny, nil))
	if err != nil || answer.Text != "from b" {
		t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
	}
	checkKinds(t, records, "gemini-a transient", "gemini-a transient", "gemini-a transient", "gemini-b ok")
	for i, a := range records[:3] {
		if a.Delivered {
			t.Errorf("record %d: Delivered = true, want false: the caller saw nothing", i)
		}
		if a.RawText == nil || !strings.HasPrefix(*a.RawText, "chunk1 ") {
			t.Errorf("record %d: RawText = %v, want the text held when it broke", i, a.RawText)
		}
	}
	matchLog(t, records, err, srv)
}

func TestUnfinishedIsNotSuccess(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mode mode
		step llmretrytest.Step
		want []string // the records' kinds
		raw  string   // the last record's raw text, when the chain fails
	}{
		// A JSON answer with no finishReason was cut short somewhere.
		{"json", jsonMode, llmretrytest.StreamUnfinished(2), []string{"gemini-a transient", "gemini-a ok"}, ""},
		{"stream_before_text", streamMode, llmretrytest.StreamUnfinished(0), []string{"gemini-a transient", "gemini-a ok"}, ""},
		{"stream_after_text", streamMode, llmretrytest.StreamUnfinished(2), []string{"gemini-a transient"}, "chunk1 chunk2 "},
		{"buffered_after_text", bufferedMode, llmretrytest.StreamUnfinished(2), []string{"gemini-a transient", "gemini-a ok"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", tc.step, llmretrytest.Answer("ok"))
			_, records, err := run(t.Context(), tc.mode.backend(newClient(t, srv), "gemini-a", tiny, nil))
			checkKinds(t, records, tc.want...)
			if last := records[len(records)-1]; tc.raw != "" && (err == nil || last.RawText == nil || *last.RawText != tc.raw) {
				t.Errorf("Do() = %v with RawText %v; want an error keeping %q", err, last.RawText, tc.raw)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestConnectionRefusedIsTransient(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			down := newServer(t)
			// The first request finds the provider going down; the
			// retries find nothing listening.
			down.Script("gemini-a", llmretrytest.Down())
			up := newServer(t)
			up.Script("gemini-b", llmretrytest.Answer("from b"))
			answer, records, err := run(t.Context(),
				m.backend(newClient(t, down), "gemini-a", tiny, nil),
				m.backend(newClient(t, up), "gemini-b", tiny, nil))
			if err != nil || answer.Text != "from b" {
				t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
			}
			checkKinds(t, records, "gemini-a transient", "gemini-a transient", "gemini-a transient", "gemini-b ok")
			for _, a := range records[1:3] {
				if !errors.Is(a.Err, syscall.ECONNREFUSED) {
					t.Errorf("retry of a: %v, want a refused connection", a.Err)
				}
			}
			matchLog(t, records, err, down, up)
		})
	}
}

func TestNoTextIsParseFailure(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.Answer(""), llmretrytest.Answer("ok"))
			answer, records, err := run(t.Context(), m.backend(newClient(t, srv), "gemini-a", tiny, nil))
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
			}
			checkKinds(t, records, "gemini-a parse", "gemini-a ok")
			matchLog(t, records, err, srv)
		})
	}
}

// The statuses a record carries for an HTTP error must be the response's,
// for any status the provider sends.
func TestStatusesReachRecords(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusInternalServerError, http.StatusGatewayTimeout} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.Status(code))
			_, records, err := run(t.Context(), jsonMode.backend(newClient(t, srv), "gemini-a", tiny, nil))
			want := "gemini-a rejected"
			n := 1
			if code >= 500 {
				want, n = "gemini-a transient", 3
			}
			checkKinds(t, records, slices.Repeat([]string{want}, n)...)
			matchLog(t, records, err, srv)
		})
	}
}

// An attempt ended by Backend.Timeout says so in its record, "llmretry:
// attempt timeout", not as the SDK's bare "context deadline exceeded".
func TestTimeoutNamesItsCause(t *testing.T) {
	t.Parallel()
	steps := map[bool]llmretrytest.Step{false: llmretrytest.StallHeaders(), true: llmretrytest.StreamStall(0)}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", steps[m.stream], llmretrytest.Answer("ok"))
			b := m.backend(newClient(t, srv), "gemini-a", tiny, nil)
			b.Timeout = 300 * time.Millisecond
			answer, records, err := run(t.Context(), b)
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
			}
			checkKinds(t, records, "gemini-a timeout", "gemini-a ok")
			// The same text as the other adapters' record of the same
			// attempt.
			if got, want := records[0].Err.Error(), llmretry.ErrAttemptTimeout.Error(); got != want {
				t.Errorf("timed-out record's error = %q, want %q", got, want)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestBrokenResponses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mode mode
		step llmretrytest.Step
		want []string // the records' kinds
	}{
		// Connections that break before any answer are worth another try.
		{"json_hangup", jsonMode, llmretrytest.Hangup(), []string{"gemini-a transient", "gemini-a ok"}},
		{"stream_hangup", streamMode, llmretrytest.Hangup(), []string{"gemini-a transient", "gemini-a ok"}},
		{"json_body_cut", jsonMode, llmretrytest.StreamDrop(2), []string{"gemini-a transient", "gemini-a ok"}},
		// A body or an event that does not decode may decode on the next
		// try.
		{"json_malformed", jsonMode, llmretrytest.Malformed(), []string{"gemini-a transient", "gemini-a ok"}},
		{"stream_malformed", streamMode, llmretrytest.Malformed(), []string{"gemini-a transient", "gemini-a ok"}},
		{"buffered_malformed", bufferedMode, llmretrytest.Malformed(), []string{"gemini-a transient", "gemini-a ok"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", tc.step, llmretrytest.Answer("ok"))
			_, records, err := run(t.Context(), tc.mode.backend(newClient(t, srv), "gemini-a", tiny, nil))
			if err != nil {
				t.Fatalf("Do() = %v, want an answer", err)
			}
			checkKinds(t, records, tc.want...)
			if msg := records[0].Err.Error(); strings.Contains(msg, "Hel") {
				t.Errorf("record error %q quotes the undecoded body", msg)
			}
			matchLog(t, records, err, srv)
		})
	}
}
