package genairetry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
	"google.golang.org/genai"
)

// apiError builds the SDK's error as it decodes Google's error body.
func apiError(t *testing.T, body string) genai.APIError {
	t.Helper()
	var e struct {
		Error genai.APIError `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("Unmarshal(%q) = %v", body, err)
	}
	return e.Error
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
	retryInfo := `{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"22s"}`
	quota := func(id, metric string) string {
		return fmt.Sprintf(`{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":%q,"quotaId":%q,"quotaValue":"50"}]}`, metric, id)
	}
	body := func(code int, status, msg string, details ...string) string {
		d := ""
		for i, s := range details {
			if i > 0 {
				d += ","
			}
			d += s
		}
		return fmt.Sprintf(`{"error":{"code":%d,"message":%q,"status":%q,"details":[%s]}}`, code, msg, status, d)
	}
	tests := []struct {
		name string
		body string
		want mapped
	}{
		{"unavailable", body(503, "UNAVAILABLE", "The model is overloaded."),
			mapped{llmretry.KindTransient, 503, 0, "http 503: genairetry: UNAVAILABLE: The model is overloaded."}},
		{"internal", body(500, "INTERNAL", "An internal error has occurred."),
			mapped{llmretry.KindTransient, 500, 0, "http 500: genairetry: INTERNAL: An internal error has occurred."}},
		{"retry_info", body(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted", quota("GenerateRequestsPerMinutePerProjectPerModel", "generativelanguage.googleapis.com/generate_content_requests"), retryInfo),
			mapped{llmretry.KindTransient, 429, 22 * time.Second, "http 429: genairetry: RESOURCE_EXHAUSTED: Resource has been exhausted"}},
		{"retry_info_fraction", body(429, "RESOURCE_EXHAUSTED", "slow down", `{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}`),
			mapped{llmretry.KindTransient, 429, 1500 * time.Millisecond, "http 429: genairetry: RESOURCE_EXHAUSTED: slow down"}},
		{"retry_info_unreadable", body(429, "RESOURCE_EXHAUSTED", "slow down", `{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"soon"}`),
			mapped{llmretry.KindTransient, 429, 0, "http 429: genairetry: RESOURCE_EXHAUSTED: slow down"}},
		{"daily_quota_id", body(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota", quota("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "generativelanguage.googleapis.com/generate_content_free_tier_requests"), retryInfo),
			mapped{llmretry.KindRejected, 429, 0, "http 429: genairetry: RESOURCE_EXHAUSTED: You exceeded your current quota (daily quota GenerateRequestsPerDayPerProjectPerModel-FreeTier is spent; retrying within the call cannot help)"}},
		{"daily_quota_metric", body(429, "RESOURCE_EXHAUSTED", "quota", quota("", "aiplatform.googleapis.com/generate_content_requests_per_day")),
			mapped{llmretry.KindRejected, 429, 0, "http 429: genairetry: RESOURCE_EXHAUSTED: quota (daily quota aiplatform.googleapis.com/generate_content_requests_per_day is spent; retrying within the call cannot help)"}},
		{"invalid_argument", body(400, "INVALID_ARGUMENT", "The input token count (1048577) exceeds the maximum"),
			mapped{llmretry.KindRejected, 400, 0, "http 400: genairetry: INVALID_ARGUMENT: The input token count (1048577) exceeds the maximum"}},
		{"failed_precondition", body(400, "FAILED_PRECONDITION", "User location is not supported for the API use."),
			mapped{llmretry.KindRejected, 400, 0, "http 400: genairetry: FAILED_PRECONDITION: User location is not supported for the API use."}},
		{"not_found", body(404, "NOT_FOUND", "models/gemini-nope is not found"),
			mapped{llmretry.KindRejected, 404, 0, "http 404: genairetry: NOT_FOUND: models/gemini-nope is not found"}},
		// A status name it does not know is classified by the code.
		{"unknown_status_5xx", body(502, "", "Bad Gateway"),
			mapped{llmretry.KindTransient, 502, 0, "http 502: genairetry: error: Bad Gateway"}},
		// Multi-line messages are kept to one line, and keys are redacted.
		{"redacted", body(400, "INVALID_ARGUMENT", "API key not valid.\nkey=AIzaSyTest0123456789abcdefghijklmnopq"),
			mapped{llmretry.KindRejected, 400, 0, "http 400: genairetry: INVALID_ARGUMENT: API key not valid. key=REDACTED"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			orig := apiError(t, tc.body)
			err := genairetry.Failure(fmt.Errorf("wrapped: %w", orig))
			var f *llmretry.Failure
			if !errors.As(err, &f) {
				t.Fatalf("Failure() = %T %v, want a *llmretry.Failure", err, err)
			}
			got := mapped{f.Kind, f.Status, f.RetryAfter, f.Error()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Failure() (-want +got):\n%s", diff)
			}
			var back genai.APIError
			if !errors.As(err, &back) || back.Code != orig.Code {
				t.Errorf("errors.As(Failure(), genai.APIError) = %v, want the SDK's error", back)
			}
		})
	}
}

func TestFailureOtherErrors(t *testing.T) {
	t.Parallel()
	already := &llmretry.Failure{Kind: llmretry.KindParse}
	// An error of the SDK's that is no response's: not taken for an
	// undecodable one, so it is not retried as if it were.
	notSent := errors.New("createAPIURL: error parsing base URL: bad")
	tests := []struct {
		name string
		err  error
		want error // returned unchanged when not nil
		kind llmretry.Kind
	}{
		{"nil", nil, nil, llmretry.KindUnknown},
		{"refused", fmt.Errorf("doRequest: error sending request: %w", syscall.ECONNREFUSED), nil, llmretry.KindTransient},
		{"cut", io.ErrUnexpectedEOF, io.ErrUnexpectedEOF, llmretry.KindTransient},
		{"deadline", context.DeadlineExceeded, context.DeadlineExceeded, llmretry.KindTimeout},
		{"already_mapped", already, already, llmretry.KindParse},
		{"not_sent", notSent, notSent, llmretry.KindUnknown},
		// What the SDK returns for a body or event it could not decode.
		{"undecodable_line", fmt.Errorf("iterateResponseStream: invalid stream chunk: event:{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel"), nil, llmretry.KindTransient},
		{"undecodable_json", fmt.Errorf("deserializeUnaryResponse: error unmarshalling response: %w", json.Unmarshal([]byte(`{"candidates":[`), new(any))), nil, llmretry.KindTransient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := genairetry.Failure(tc.err)
			if tc.err == nil {
				if got != nil {
					t.Errorf("Failure(nil) = %v, want nil", got)
				}
				return
			}
			if tc.want != nil && got != tc.want {
				t.Errorf("Failure(%v) = %v, want it unchanged", tc.err, got)
			}
			if k := llmretry.Classify(got); k != tc.kind {
				t.Errorf("Classify(Failure(%v)) = %v, want %v", tc.err, k, tc.kind)
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("errors.Is(Failure(%v), the error) = false, want true", tc.err)
			}
		})
	}
}
