package riverretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/riverretry"
)

// Typed errors as a chain returns them, built from their records.
func truncatedErr() error {
	raw := "The answer was cut"
	return llmretry.Exhaust([]llmretry.Attempt{{Model: "m", Try: 1, Kind: llmretry.KindTruncated, RawText: &raw, Err: errors.New("length")}})
}

func transientErr(retryAfter time.Duration) error {
	return llmretry.Exhaust([]llmretry.Attempt{{
		Model: "m", Try: 1, Kind: llmretry.KindTransient, Status: 429,
		Err: errors.New("rate limited"), Start: time.Now(), RetryAfter: retryAfter,
	}})
}

// mapping names what Result returned, so a table can say it.
func mapping(err error) string {
	var (
		cancel *rivertype.JobCancelError
		snooze *rivertype.JobSnoozeError
		mapped *riverretry.Error
	)
	switch {
	case err == nil:
		return "nil"
	case errors.As(err, &cancel):
		if errors.As(err, &mapped) {
			return "cancel(*Error)"
		}
		return "cancel"
	case errors.As(err, &snooze):
		return "snooze"
	case errors.As(err, &mapped):
		return "*Error"
	}
	return "as is"
}

// TestResult covers the mappings that need no River work context: a
// snooze does, to count itself, so outside River an advice to wait falls
// back to the error (the integration test covers snoozing).
func TestResult(t *testing.T) {
	plain := errors.New("database is down")
	cancelled := &llmretry.Cancelled{Cause: context.Canceled}
	already := &riverretry.Error{Err: transientErr(0)}
	snoozed := river.JobSnooze(time.Second)
	tests := []struct {
		name    string
		adapter riverretry.Adapter
		err     error
		want    string
		same    bool // the very error passed in comes back
	}{
		{name: "nil", err: nil, want: "nil"},
		{name: "truncated", err: truncatedErr(), want: "cancel(*Error)"},
		{name: "truncated_wrapped", err: fmt.Errorf("item 7: %w", truncatedErr()), want: "cancel(*Error)"},
		{name: "truncated_by_handler", adapter: riverretry.Adapter{CancelByHandler: true}, err: truncatedErr(), want: "*Error"},
		{name: "transient", err: transientErr(0), want: "*Error"},
		{name: "retry_after_outside_river", err: transientErr(time.Minute), want: "*Error"},
		{name: "cancelled", err: cancelled, want: "as is", same: true},
		{name: "cancelled_wrapped", err: fmt.Errorf("job 7: %w", cancelled), want: "as is", same: true},
		// The run failed; only an attempt of it was cancelled (a chain
		// inside the attempt withdrew): not River's shutdown.
		{name: "cancelled_attempt", err: llmretry.Exhaust([]llmretry.Attempt{{
			Model: "inner", Try: 1, Kind: llmretry.KindTransient, Err: &llmretry.Cancelled{Cause: context.Canceled},
		}}), want: "*Error"},
		{name: "plain", err: plain, want: "as is", same: true},
		{name: "already_mapped", err: already, want: "*Error", same: true},
		{name: "river_snooze", err: snoozed, want: "snooze", same: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			job := &rivertype.JobRow{ID: 1, Attempt: 1, MaxAttempts: 3}
			got := tc.adapter.Result(context.Background(), job, tc.err)
			if m := mapping(got); m != tc.want {
				t.Errorf("Result(%T) = %s (%v), want %s", tc.err, m, got, tc.want)
			}
			if tc.same && got != tc.err {
				t.Errorf("Result(%T) = %v, want the same error back", tc.err, got)
			}
			if tc.err != nil && !errors.Is(got, tc.err) {
				t.Errorf("errors.Is(Result(err), err) = false, want true: the worker's error stays reachable")
			}
		})
	}
}

// TestErrorText checks what River will store: the JSON record of the
// outermost typed error, whatever a worker wrapped around it.
func TestErrorText(t *testing.T) {
	typed := truncatedErr()
	want, err := json.Marshal(typed)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []error{typed, fmt.Errorf("item 7: %w", typed)} {
		got := (&riverretry.Error{Err: e}).Error()
		if got != string(want) {
			t.Errorf("Error() = %s, want %s", got, want)
		}
	}
	var tr *llmretry.Truncated
	if !errors.As(&riverretry.Error{Err: typed}, &tr) {
		t.Error("errors.As(*Error, *Truncated) = false, want true")
	}
	if got, want := (&riverretry.Error{Err: errors.New("plain")}).Error(), "plain"; got != want {
		t.Errorf("Error() = %q, want %q for an error without a record", got, want)
	}
	if got := (&riverretry.Error{}).Error(); got != "riverretry: nil error" {
		t.Errorf("Error() of a zero Error = %q", got)
	}
}

type fixedHandler struct{ res *river.ErrorHandlerResult }

func (h fixedHandler) HandleError(context.Context, *rivertype.JobRow, error) *river.ErrorHandlerResult {
	return h.res
}

func (h fixedHandler) HandlePanic(context.Context, *rivertype.JobRow, any, string) *river.ErrorHandlerResult {
	return h.res
}

func TestErrorHandler(t *testing.T) {
	cancel := &river.ErrorHandlerResult{SetCancelled: true}
	tests := []struct {
		name string
		next river.ErrorHandler
		err  error
		want *river.ErrorHandlerResult
	}{
		{name: "truncated", err: truncatedErr(), want: cancel},
		{name: "truncated_mapped", err: &riverretry.Error{Err: truncatedErr()}, want: cancel},
		{name: "transient", err: transientErr(0), want: nil},
		{name: "plain", err: errors.New("database is down"), want: nil},
		{name: "next_asks_nothing", next: fixedHandler{}, err: truncatedErr(), want: cancel},
		{name: "next_cancels", next: fixedHandler{cancel}, err: transientErr(0), want: cancel},
		{name: "next_keeps_going", next: fixedHandler{&river.ErrorHandlerResult{}}, err: transientErr(0), want: &river.ErrorHandlerResult{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &riverretry.ErrorHandler{Next: tc.next}
			got := h.HandleError(context.Background(), &rivertype.JobRow{}, tc.err)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("HandleError() (-want +got):\n%s", diff)
			}
		})
	}
	if got := (&riverretry.ErrorHandler{}).HandlePanic(context.Background(), &rivertype.JobRow{}, "boom", ""); got != nil {
		t.Errorf("HandlePanic() = %+v, want nil", got)
	}
}

func TestJobMetadata(t *testing.T) {
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		metadata string
		want     riverretry.Metadata
		wantErr  bool
	}{
		{name: "none", metadata: ``, want: riverretry.Metadata{}},
		{name: "other_keys", metadata: `{"snoozes": 4}`, want: riverretry.Metadata{}},
		{name: "counts", metadata: `{"snoozes": 4, "llmretry": {"snoozes": 2, "cancellations": 1}}`, want: riverretry.Metadata{Snoozes: 2, Cancellations: 1}},
		{
			name:     "last_snooze",
			metadata: `{"llmretry": {"snoozes": 1, "last_snooze": {"at": "2026-11-30T09:00:00Z", "attempt": 1, "for_ms": 1500, "error": {"outcome": "exhausted"}}}}`,
			want: riverretry.Metadata{Snoozes: 1, LastSnooze: &riverretry.Snooze{
				At: at, Attempt: 1, For: 1500 * time.Millisecond, Error: json.RawMessage(`{"outcome": "exhausted"}`),
			}},
		},
		{name: "not_json", metadata: `{`, wantErr: true},
		{name: "not_a_record", metadata: `{"llmretry": 3}`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := riverretry.JobMetadata(&rivertype.JobRow{ID: 1, Metadata: []byte(tc.metadata)})
			if (err != nil) != tc.wantErr {
				t.Fatalf("JobMetadata() error = %v, want error %t", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("JobMetadata() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMetadataRoundTrip: what the adapter writes, JobMetadata reads back.
func TestMetadataRoundTrip(t *testing.T) {
	want := riverretry.Metadata{Snoozes: 3, Cancellations: 2, LastSnooze: &riverretry.Snooze{
		At: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC), Attempt: 2, For: 2 * time.Second, Error: json.RawMessage(`{"outcome":"exhausted"}`),
	}}
	data, err := json.Marshal(map[string]any{riverretry.MetadataKey: want})
	if err != nil {
		t.Fatal(err)
	}
	got, err := riverretry.JobMetadata(&rivertype.JobRow{Metadata: data})
	if err != nil {
		t.Fatalf("JobMetadata(%s) = %v", data, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("round trip of %s (-want +got):\n%s", data, diff)
	}
}
