package openairetry_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// apiError builds the error openai-go returns for an HTTP error response.
func apiError(status int, typ, code, msg string, header ...string) *openai.Error {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return &openai.Error{
		StatusCode: status, Type: typ, Code: code, Message: msg,
		Response: &http.Response{StatusCode: status, Header: h},
	}
}

// mapped is what a test reads from a *llmretry.Failure.
type mapped struct {
	Kind       llmretry.Kind
	Status     int
	RetryAfter time.Duration
	Msg        string
}

func TestFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want mapped
	}{
		{
			name: "overloaded_503",
			err:  apiError(503, "server_error", "", "The engine is currently overloaded", "x-request-id", "req_1"),
			want: mapped{llmretry.KindTransient, 503, 0, "http 503: openairetry: api error (type server_error, request req_1): The engine is currently overloaded"},
		},
		{
			name: "rate_limit_retry_after_ms",
			err:  apiError(429, "requests", "rate_limit_exceeded", "Rate limit reached", "retry-after-ms", "300"),
			want: mapped{llmretry.KindTransient, 429, 300 * time.Millisecond, "http 429: openairetry: api error (type requests, code rate_limit_exceeded): Rate limit reached"},
		},
		{
			name: "insufficient_quota",
			err:  apiError(429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota", "x-request-id", "req_2"),
			want: mapped{llmretry.KindRejected, 429, 0, "http 429: openairetry: api error (type insufficient_quota, code insufficient_quota, request req_2): You exceeded your current quota"},
		},
		{
			name: "context_length_exceeded",
			err:  apiError(400, "invalid_request_error", "context_length_exceeded", "This model's maximum context length is 8 tokens.\nPlease reduce the length."),
			want: mapped{llmretry.KindRejected, 400, 0, "http 400: openairetry: api error (type invalid_request_error, code context_length_exceeded): This model's maximum context length is 8 tokens. Please reduce the length."},
		},
		{
			name: "content_policy_violation",
			err:  apiError(400, "invalid_request_error", "content_policy_violation", "Your request was rejected as a result of our safety system."),
			want: mapped{llmretry.KindRefused, 400, 0, "http 400: openairetry: api error (type invalid_request_error, code content_policy_violation): Your request was rejected as a result of our safety system."},
		},
		{
			name: "azure_content_filter",
			err:  apiError(400, "", "content_filter", "The response was filtered due to the prompt triggering Azure OpenAI's content management policy."),
			want: mapped{llmretry.KindRefused, 400, 0, "http 400: openairetry: api error (code content_filter): The response was filtered due to the prompt triggering Azure OpenAI's content management policy."},
		},
		{
			name: "should_retry_false",
			err:  apiError(500, "server_error", "", "", "x-should-retry", "false"),
			want: mapped{llmretry.KindRejected, 500, 0, "http 500: openairetry: api error (type server_error)"},
		},
		{
			name: "wrapped",
			err:  fmt.Errorf("calling: %w", apiError(502, "", "", "bad gateway")),
			want: mapped{llmretry.KindTransient, 502, 0, "http 502: openairetry: api error: bad gateway"},
		},
		{
			name: "stream_server_error",
			err:  &ssestream.StreamError{Event: ssestream.Event{Data: []byte(`{"error":{"message":"boom","type":"server_error","code":null}}`)}},
			want: mapped{llmretry.KindTransient, 500, 0, "http 500: openairetry: stream error (type server_error): boom"},
		},
		{
			name: "stream_overloaded",
			err:  &ssestream.StreamError{Event: ssestream.Event{Data: []byte(`{"error":{"message":"busy","type":"overloaded_error"}}`)}},
			want: mapped{llmretry.KindTransient, 529, 0, "http 529: openairetry: stream error (type overloaded_error): busy"},
		},
		{
			name: "stream_invalid_request",
			err:  &ssestream.StreamError{Event: ssestream.Event{Data: []byte(`{"error":{"message":"bad","type":"invalid_request_error","code":"invalid_value"}}`)}},
			want: mapped{llmretry.KindRejected, 0, 0, "rejected: openairetry: stream error (type invalid_request_error, code invalid_value): bad"},
		},
		{
			name: "stream_content_filter",
			err:  &ssestream.StreamError{Event: ssestream.Event{Data: []byte(`{"error":{"message":"filtered","type":"invalid_request_error","code":"content_filter"}}`)}},
			want: mapped{llmretry.KindRefused, 0, 0, "refused: openairetry: stream error (type invalid_request_error, code content_filter): filtered"},
		},
		{
			name: "stream_unknown_shape",
			err:  &ssestream.StreamError{Message: "received error while streaming: oops", Event: ssestream.Event{Data: []byte(`{"error":"oops"}`)}},
			want: mapped{llmretry.KindTransient, 0, 0, "transient: openairetry: stream error: received error while streaming: oops"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := openairetry.Failure(tc.err)
			f, ok := errors.AsType[*llmretry.Failure](err)
			if !ok {
				t.Fatalf("Failure() = %T %v, want a *llmretry.Failure", err, err)
			}
			got := mapped{f.Kind, f.Status, f.RetryAfter, f.Error()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Failure() mismatch (-want +got):\n%s", diff)
			}
			if llmretry.Classify(err) != tc.want.Kind {
				t.Errorf("Classify(Failure()) = %v, want %v", llmretry.Classify(err), tc.want.Kind)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("errors.Is(Failure(), original) = false, want true")
			}
		})
	}
}

// TestFailureLeavesOthers checks that errors other than the provider's
// come back as they were, so the chain's Classify judges them.
func TestFailureLeavesOthers(t *testing.T) {
	t.Parallel()
	refused := &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}
	own := llmretry.Truncation("half")
	tests := []struct {
		name string
		err  error
		kind llmretry.Kind
	}{
		{"nil", nil, llmretry.KindUnknown},
		{"refused", fmt.Errorf("post: %w", refused), llmretry.KindTransient},
		{"own_failure", own, llmretry.KindTruncated},
		{"wrapped_own_failure", fmt.Errorf("x: %w", own), llmretry.KindTruncated},
		{"plain", errors.New("something else"), llmretry.KindUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := openairetry.Failure(tc.err)
			if got != tc.err {
				t.Errorf("Failure(%v) = %v, want it unchanged", tc.err, got)
			}
			if k := llmretry.Classify(got); k != tc.kind {
				t.Errorf("Classify(Failure()) = %v, want %v", k, tc.kind)
			}
		})
	}
}

// TestFailureRedacts checks that a key the provider quotes back is not in
// the message, nor in the cause beneath the Failure.
func TestFailureRedacts(t *testing.T) {
	t.Parallel()
	const key = "sk-proj-abcdefghijklmnopqrstuvwxyz012345"
	err := openairetry.Failure(apiError(401, "invalid_request_error", "invalid_api_key",
		"Incorrect API key provided: "+key+". You can find your API key in your settings."))
	f, ok := errors.AsType[*llmretry.Failure](err)
	if !ok {
		t.Fatalf("Failure() = %T %v, want a *llmretry.Failure", err, err)
	}
	for _, msg := range []string{f.Error(), f.Err.Error()} {
		if strings.Contains(msg, key) || !strings.Contains(msg, "Incorrect API key provided: REDACTED") {
			t.Errorf("message = %q, want the key redacted", msg)
		}
	}
}

// TestFailureKeepsSDKError checks that callers can still reach the SDK's
// error and its fields beneath the Failure.
func TestFailureKeepsSDKError(t *testing.T) {
	t.Parallel()
	orig := apiError(429, "insufficient_quota", "insufficient_quota", "pay up")
	got, ok := errors.AsType[*openai.Error](openairetry.Failure(orig))
	if !ok || got != orig {
		t.Fatalf("errors.AsType[*openai.Error](Failure()) = %v, %v; want the original", got, ok)
	}
}
