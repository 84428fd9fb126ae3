package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
