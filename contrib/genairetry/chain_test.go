package genairetry_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
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
				llmretrytest.CheckLog(t, records, err, srv)
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
			llmretrytest.CheckLog(t, records, err, srv)
		})
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
				llmretrytest.CheckLog(t, records, err, srv)
			})
		}
	}
}
