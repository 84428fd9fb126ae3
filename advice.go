package llmretry

import "errors"

// ItemRetryable is implemented by errors that can tell an orchestrator —
// a job queue, a batch pipeline, a supervisor — whether running the same
// item again could succeed. ItemRetryable returns false for a failure that
// a blind re-run would repeat exactly, such as a [Truncated] completion, an
// [Exhausted] chain whose every attempt was refused, or an invalid [Chain]
// configuration. Each of this package's four error types declares its own
// advice, so a probe stops at the outermost one.
//
// The contract is duck-typed both ways: any error from any library may
// implement it, and an error that does not is retryable. Probe it with
// [RetryItem], never by asserting on the top-level error. A type that
// wraps other errors should implement it only if it answers for every
// error beneath it, because errors.As stops at the first one it finds.
type ItemRetryable interface {
	ItemRetryable() bool
}

// RetryItem reports whether an orchestrator should run the failed item
// again. It returns false for a nil error (there is nothing to retry) and
// otherwise the advice of the first error in err's tree that implements
// [ItemRetryable], found as errors.As finds it; an error without advice is
// retryable.
func RetryItem(err error) bool {
	if err == nil {
		return false
	}
	var advice ItemRetryable
	if errors.As(err, &advice) {
		return advice.ItemRetryable()
	}
	return true // absent means retryable: a failure we know nothing about keeps its budget
}
