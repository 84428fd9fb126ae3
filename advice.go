package llmretry

import (
	"errors"
	"math"
	"time"
)

// ItemRetryable is implemented by errors that can tell an orchestrator —
// a job queue, a batch pipeline, a supervisor — whether running the same
// item again could succeed. ItemRetryable returns false for a failure that
// a blind re-run would repeat exactly, such as a [Truncated] completion, an
// [Exhausted] chain whose every attempt was refused, or an invalid [Chain]
// configuration. Each of this package's four error types declares its own
// advice, so a probe stops at the outermost one; and none holds an
// attempt's error or a cause in its tree, so nothing beneath it could
// answer instead.
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
// retryable. For an error that [Chain.Do] returned (wrapped or not), that
// is the advice of its outcome: the attempts' errors and a Cancelled's or
// TimedOut's Cause are not in its tree, so a sibling's Truncated that
// cancelled the call, or a backend's error that says "do not retry",
// never speaks for it.
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

// ItemRetryAfter is implemented by errors that can tell an orchestrator
// when running the same item again could first succeed: the time from now
// until the earliest moment any backend said it would take work again. A
// job queue uses it to snooze an item instead of spending one of its
// attempts on a provider that has asked for time. Zero means no advice.
//
// Like [ItemRetryable], the contract is duck-typed: any error may
// implement it, and a type that wraps others should implement it only if
// it answers for every error beneath it.
type ItemRetryAfter interface {
	ItemRetryAfter() time.Duration
}

// RetryItemAfter reports how long an orchestrator should wait before it
// runs a failed item again, probing err's tree for [ItemRetryAfter] as
// [RetryItem] probes for its advice. It returns false when no error in the
// tree gives the advice, or when the advice is zero (run it again whenever
// the orchestrator's own waits say). As for RetryItem, an error that
// [Chain.Do] returned answers with its outcome's advice alone. Ask
// [RetryItem] first: an item that must not be run again has no time to
// wait for.
func RetryItemAfter(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	var advice ItemRetryAfter
	if errors.As(err, &advice) {
		if d := advice.ItemRetryAfter(); d > 0 {
			return d, true
		}
	}
	return 0, false
}

// retryAfter is the advice of a chain's attempts at now: when every
// backend's last attempt carried a retry-after hint, the time until the
// soonest of them runs out, counted from the end of that attempt; 0 when
// one gave no hint, or when that moment has passed.
func retryAfter(attempts []Attempt, now time.Time) time.Duration {
	last := map[int]*Attempt{}
	for i := range attempts {
		last[attempts[i].Backend] = &attempts[i]
	}
	soonest := time.Duration(math.MaxInt64)
	for _, a := range last {
		// Time already spent counts. Both terms are non-negative, so the
		// difference cannot overflow.
		left := a.RetryAfter - max(now.Sub(a.Start.Add(a.Elapsed)), 0)
		if a.RetryAfter <= 0 || left <= 0 {
			return 0 // this backend may take work now, as far as anyone said
		}
		soonest = min(soonest, left)
	}
	if len(last) == 0 {
		return 0
	}
	return soonest
}
