package llmretry_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/llmretry/llmretry"
)

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
