package llmretry_test

import (
	"errors"

	"github.com/llmretry/llmretry"
)

// lastErr returns the Err of the last record of one of the chain's
// errors: where the last provider error is kept, since no attempt's error
// is in the chain's error tree. nil when err has no records.
func lastErr(err error) error {
	var attempts []llmretry.Attempt
	var ex *llmretry.Exhausted
	var ca *llmretry.Cancelled
	switch {
	case errors.As(err, &ex):
		attempts = ex.Attempts
	case errors.As(err, &ca):
		attempts = ca.Attempts
	}
	if len(attempts) == 0 {
		return nil
	}
	return attempts[len(attempts)-1].Err
}

// lastErrIs reports whether the last record's Err matches target.
func lastErrIs(err, target error) bool { return errors.Is(lastErr(err), target) }
