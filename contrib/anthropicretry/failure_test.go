package anthropicretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
)

// apiError builds the SDK's error as it does for a response with status
// and body; status 200 is an error event inside a stream.
func apiError(t *testing.T, status int, header http.Header, body string) *anthropic.Error {
	t.Helper()
	if header == nil {
		header = http.Header{}
	}
	e := &anthropic.Error{
		StatusCode: status,
		RequestID:  header.Get("request-id"),
		Response:   &http.Response{StatusCode: status, Header: header},
	}
	if err := e.UnmarshalJSON([]byte(body)); err != nil {
		t.Fatalf("UnmarshalJSON(%q) = %v", body, err)
	}
	return e
}

func errorBody(typ, msg string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, typ, msg)
}

// mapped is what a test compares of a Failure.
type mapped struct {
	Kind       llmretry.Kind
	Status     int
	RetryAfter time.Duration
	Msg        string
}

func TestFailureAPIErrors(t *testing.T) {
	t.Parallel()
	id := func(kv ...string) http.Header {
		h := http.Header{"Request-Id": {"req_7"}}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	tests := []struct {
		name   string
		status int
		header http.Header
		body   string
		want   mapped
	}{
		{"overloaded_529", 529, id(), errorBody("overloaded_error", "Overloaded"),
			mapped{llmretry.KindTransient, 529, 0, "http 529: anthropicretry: overloaded_error: Overloaded (request-id req_7)"}},
		{"rate_limit_retry_after_ms", 429, id("retry-after-ms", "300"), errorBody("rate_limit_error", "slow down"),
			mapped{llmretry.KindTransient, 429, 300 * time.Millisecond, "http 429: anthropicretry: rate_limit_error: slow down (request-id req_7)"}},
		{"api_error_500", 500, id("retry-after", "2"), errorBody("api_error", "Internal server error"),
			mapped{llmretry.KindTransient, 500, 2 * time.Second, "http 500: anthropicretry: api_error: Internal server error (request-id req_7)"}},
		{"prompt_too_long", 400, id(), errorBody("invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum"),
			mapped{llmretry.KindRejected, 400, 0, "http 400: anthropicretry: invalid_request_error: prompt is too long: 250000 tokens > 200000 maximum (request-id req_7)"}},
		{"should_retry_false", 503, id("x-should-retry", "false"), errorBody("api_error", "down"),
			mapped{llmretry.KindRejected, 503, 0, "http 503: anthropicretry: api_error: down (request-id req_7)"}},
		{"authentication_despite_should_retry", 401, id("x-should-retry", "true"), errorBody("authentication_error", "invalid x-api-key"),
			mapped{llmretry.KindRejected, 401, 0, "http 401: anthropicretry: authentication_error: invalid x-api-key (request-id req_7)"}},
		{"permission", 403, id(), errorBody("permission_error", "no"),
			mapped{llmretry.KindRejected, 403, 0, "http 403: anthropicretry: permission_error: no (request-id req_7)"}},
		{"not_found", 404, id(), errorBody("not_found_error", "model: claude-nope"),
			mapped{llmretry.KindRejected, 404, 0, "http 404: anthropicretry: not_found_error: model: claude-nope (request-id req_7)"}},
		{"not_json_no_id", 502, nil, "<html>Bad Gateway</html>",
			mapped{llmretry.KindTransient, 502, 0, "http 502: anthropicretry: error: Bad Gateway"}},
		{"key_echoed", 401, id(), errorBody("authentication_error", "invalid x-api-key sk-ant-api03-abcdefghijklmnop"),
			mapped{llmretry.KindRejected, 401, 0, "http 401: anthropicretry: authentication_error: invalid x-api-key REDACTED (request-id req_7)"}},
		{"multi_line_message", 400, id(), errorBody("invalid_request_error", "first\nsecond"),
			mapped{llmretry.KindRejected, 400, 0, "http 400: anthropicretry: invalid_request_error: first second (request-id req_7)"}},
		{"stream_overloaded", 200, id(), errorBody("overloaded_error", "Overloaded"),
			mapped{llmretry.KindTransient, 529, 0, "http 529: anthropicretry: overloaded_error in stream: Overloaded (request-id req_7)"}},
		{"stream_api_error", 200, id(), errorBody("api_error", "boom"),
			mapped{llmretry.KindTransient, 500, 0, "http 500: anthropicretry: api_error in stream: boom (request-id req_7)"}},
		{"stream_rate_limit", 200, id(), errorBody("rate_limit_error", "slow"),
			mapped{llmretry.KindTransient, 429, 0, "http 429: anthropicretry: rate_limit_error in stream: slow (request-id req_7)"}},
		{"stream_invalid_request", 200, id(), errorBody("invalid_request_error", "bad"),
			mapped{llmretry.KindRejected, 0, 0, "rejected: anthropicretry: invalid_request_error in stream: bad (request-id req_7)"}},
		{"stream_unknown_type", 200, id(), errorBody("surprise_error", "?"),
			mapped{llmretry.KindUnknown, 0, 0, "unknown: anthropicretry: surprise_error in stream: ? (request-id req_7)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sdkErr := apiError(t, tc.status, tc.header, tc.body)
			err := anthropicretry.Failure(fmt.Errorf("wrapped: %w", sdkErr))
			var f *llmretry.Failure
			if !errors.As(err, &f) {
				t.Fatalf("Failure() = %T %v, want a *llmretry.Failure", err, err)
			}
			got := mapped{f.Kind, f.Status, f.RetryAfter, f.Error()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Failure() mismatch (-want +got):\n%s", diff)
			}
			// The cause is a field of its own, printed apart from the
			// Failure by whoever reads it.
			if msg := f.Err.Error(); strings.Contains(msg, "sk-ant-") {
				t.Errorf("Failure().Err = %q, want any key redacted", msg)
			}
			if k := llmretry.Classify(err); k != tc.want.Kind {
				t.Errorf("Classify(Failure()) = %v, want %v", k, tc.want.Kind)
			}
			var back *anthropic.Error
			if ok := errors.As(err, &back); !ok || back != sdkErr {
				t.Errorf("errors.As(Failure(), *anthropic.Error) = %v, %v; want the SDK's error", back, ok)
			}
		})
	}
}

func TestFailureLeavesOtherErrors(t *testing.T) {
	t.Parallel()
	refused := &netOpError{syscall.ECONNREFUSED}
	already := llmretry.Truncation("so far")
	tests := []struct {
		name string
		err  error
		kind llmretry.Kind
	}{
		{"refused", fmt.Errorf("Post %q: %w", "http://127.0.0.1:1/v1/messages", refused), llmretry.KindTransient},
		{"unexpected_eof", io.ErrUnexpectedEOF, llmretry.KindTransient},
		{"deadline", context.DeadlineExceeded, llmretry.KindTimeout},
		{"cancelled", context.Canceled, llmretry.KindCancelled},
		{"already_mapped", already, llmretry.KindTruncated},
		{"other", errors.New("boom"), llmretry.KindUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := anthropicretry.Failure(tc.err)
			if got != tc.err {
				t.Errorf("Failure(%v) = %v, want it unchanged", tc.err, got)
			}
			if k := llmretry.Classify(got); k != tc.kind {
				t.Errorf("Classify(Failure(%v)) = %v, want %v", tc.err, k, tc.kind)
			}
		})
	}
	if err := anthropicretry.Failure(nil); err != nil {
		t.Errorf("Failure(nil) = %v, want nil", err)
	}
}

// netOpError stands for the dial error net/http wraps.
type netOpError struct{ errno syscall.Errno }

func (e *netOpError) Error() string { return "dial tcp: " + e.errno.Error() }
func (e *netOpError) Unwrap() error { return e.errno }
