package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmretry/llmretry"
)

// advice is an error that gives its own item advice.
type advice struct {
	retry bool
	err   error
}

func (a *advice) Error() string       { return fmt.Sprintf("advice %t", a.retry) }
func (a *advice) Unwrap() error       { return a.err }
func (a *advice) ItemRetryable() bool { return a.retry }

// layer is how a caller's package gives chain failures its own type.
type layer struct{ err error }

func (l *layer) Error() string { return "summarise: " + l.err.Error() }
func (l *layer) Unwrap() error { return l.err }

func TestRetryItem(t *testing.T) {
	attempts := attemptsOf(llmretry.KindTransient)
	truncated := &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: attempts}}
	configErr := (&llmretry.Chain[string, string]{}).Validate()

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain_error", errors.New("disk full"), true},
		{"exhausted", &llmretry.Exhausted{Attempts: attempts}, true},
		{"timed_out", &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attempts}}, true},
		{"cancelled", &llmretry.Cancelled{Attempts: attempts, Cause: context.Canceled}, true},
		{"truncated", truncated, false},
		{"wrapped_truncated", fmt.Errorf("job 7: %w", truncated), false},
		{"layer_over_truncated", &layer{err: truncated}, false},
		{"joined_with_truncated", errors.Join(errors.New("other"), truncated), false},
		{"config_error", configErr, false},
		{"own_advice_false", &advice{retry: false}, false},
		{"own_advice_true", &advice{retry: true}, true},
		// errors.As stops at the first error with the method: the outer advice
		// answers for its whole subtree.
		{"outer_advice_wins", &advice{retry: true, err: truncated}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := llmretry.RetryItem(tc.err); got != tc.want {
				t.Errorf("RetryItem(%v) = %t, want %t", tc.err, got, tc.want)
			}
		})
	}
}

// Each of the four error types declares its own advice, so that a probe
// stops at the outermost error, whatever lies beneath it.
func TestItemRetryableDeclarations(t *testing.T) {
	rejected := []llmretry.Attempt{{Kind: llmretry.KindRejected}, {Kind: llmretry.KindTruncated}}
	mixed := []llmretry.Attempt{{Kind: llmretry.KindRejected}, {Kind: llmretry.KindTransient}}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"truncated", &llmretry.Truncated{}, false},
		{"exhausted_no_attempts", &llmretry.Exhausted{}, true},
		{"exhausted_all_refused", &llmretry.Exhausted{Attempts: rejected}, false},
		{"exhausted_one_transient", &llmretry.Exhausted{Attempts: mixed}, true},
		{"timed_out", &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: rejected}}, true},
		{"cancelled", &llmretry.Cancelled{Attempts: rejected}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ir, ok := tc.err.(llmretry.ItemRetryable)
			if !ok {
				t.Fatalf("%T does not implement ItemRetryable", tc.err)
			}
			if got := ir.ItemRetryable(); got != tc.want {
				t.Errorf("(%T).ItemRetryable() = %t, want %t", tc.err, got, tc.want)
			}
		})
	}
}

// RetryItemAfter advises the time until the soonest retry-after among the
// backends' last attempts, counted from each attempt's end and measured
// when asked, and nothing when any backend gave no hint, for a Truncated,
// or once the moment has passed.
func TestRetryItemAfter(t *testing.T) {
	hinted := func(status int, after string) *llmretry.Failure {
		h := http.Header{}
		h.Set("Retry-After", after)
		return llmretry.StatusFailure(status, h, errors.New("slow down"))
	}
	gatewayTimeout := &llmretry.Failure{Kind: llmretry.KindTimeout, Status: 504, RetryAfter: 20 * time.Second}
	tests := []struct {
		name    string
		errs    []error       // what each backend answers, after a second
		askedAt time.Duration // after Do returns, 2s after it began
		want    time.Duration
		wantOK  bool
	}{
		// The hints run out at 1s+30s and 2s+10s; asked at 6s.
		{name: "soonest_of_two", errs: []error{hinted(429, "30"), hinted(503, "10")}, askedAt: 4 * time.Second, want: 6 * time.Second, wantOK: true},
		{name: "moment_passed", errs: []error{hinted(429, "30"), hinted(503, "10")}, askedAt: 11 * time.Second},
		{name: "one_without_hint", errs: []error{hinted(429, "30"), llmretry.StatusFailure(503, nil, nil)}},
		{name: "truncated", errs: []error{hinted(429, "30"), llmretry.Truncation("cut")}},
		// A *TimedOut advises too: 2s+20s, asked at 7s.
		{name: "timed_out", errs: []error{hinted(429, "30"), gatewayTimeout}, askedAt: 5 * time.Second, want: 15 * time.Second, wantOK: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var backends []backend
				for i, e := range tc.errs {
					backends = append(backends, backend{
						Model: fmt.Sprint("m", i),
						Call: func(context.Context, string) (string, error) {
							time.Sleep(time.Second)
							return "", e
						},
					})
				}
				c := &chain{Backends: backends}
				_, err := c.Do(context.Background(), "hi")
				time.Sleep(tc.askedAt)
				got, ok := llmretry.RetryItemAfter(err)
				if got != tc.want || ok != tc.wantOK {
					t.Errorf("RetryItemAfter(%T) = %v, %t, want %v, %t", err, got, ok, tc.want, tc.wantOK)
				}
			})
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		// Not even through a cause that would advise.
		cause := &llmretry.Exhausted{Attempts: []llmretry.Attempt{{Start: time.Now(), RetryAfter: time.Hour}}}
		if d, ok := llmretry.RetryItemAfter(&llmretry.Cancelled{Cause: cause}); ok {
			t.Errorf("RetryItemAfter(*Cancelled) = %v, true, want false", d)
		}
		if d, ok := llmretry.RetryItemAfter(cause); !ok || d <= 0 {
			t.Errorf("RetryItemAfter(cause) = %v, %t, want a positive advice", d, ok)
		}
	})
}

// An error from another package that wraps ErrConfig needs no type of its
// own to advise against a re-run: ErrConfig carries the advice.
func TestRetryItemErrConfig(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"itself", llmretry.ErrConfig, false},
		{"wrapped", fmt.Errorf("llmretry: batch: runs -1 is negative: %w", llmretry.ErrConfig), false},
		{"joined", errors.Join(errors.New("disk full"), llmretry.ErrConfig), false},
		{"validate", (&llmretry.Chain[string, string]{}).Validate(), false},
		{"other", errors.New("llmretry: invalid configuration"), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := llmretry.RetryItem(tc.err); got != tc.want {
				t.Errorf("RetryItem(%v) = %t, want %t", tc.err, got, tc.want)
			}
			if got := errors.Is(tc.err, llmretry.ErrConfig); got == tc.want {
				t.Errorf("errors.Is(%v, ErrConfig) = %t, want %t", tc.err, got, !tc.want)
			}
		})
	}
}
