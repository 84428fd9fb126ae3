package temporalretry

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/llmretry/llmretry"
)

// The types of the application errors that [ActivityError] returns for
// the chain's four errors: workflow code branches on
// ApplicationError.Type(), and a retry policy may list them in
// NonRetryableErrorTypes. They are the errors' Go type names, which
// Temporal would give them too.
const (
	TypeExhausted = "Exhausted" // [*llmretry.Exhausted]: every backend failed
	TypeTruncated = "Truncated" // [*llmretry.Truncated]: an answer was cut off; never retried
	TypeTimedOut  = "TimedOut"  // [*llmretry.TimedOut]: the activity's deadline, or an attempt's, ran out
	TypeCancelled = "Cancelled" // [*llmretry.Cancelled]: the run was cancelled, but not by Temporal's request
)

// MaxRetryDelay is the longest next retry delay that [ActivityError]
// asks of Temporal. A broken server may send a retry-after of a year; the
// next run then comes after MaxRetryDelay instead, and asks again.
const MaxRetryDelay = time.Hour

// ActivityError maps err, the error of an [llmretry.Chain]'s Do inside an
// activity, onto the error that tells Temporal what to do next, and
// returns it for the activity to return. ctx is the activity's context.
// [Do] calls it; call it yourself when the activity runs the chain
// without Do, which then has no heartbeats:
//
//	answer, err := chain.Do(ctx, prompt)
//	return answer, temporalretry.ActivityError(ctx, err)
//
// For the chain's four errors (the outermost of them in err's tree), by
// the advice in err ([llmretry.RetryItem], [llmretry.RetryItemAfter]):
//
//   - a [*llmretry.Cancelled] while Temporal has asked to cancel the
//     activity: a [temporal.CanceledError], so Temporal records the
//     activity as cancelled, as it expects of a cancelled activity.
//   - RetryItem false (a [*llmretry.Truncated], a request every backend
//     refused): a non-retryable [temporal.ApplicationError], so Temporal
//     does not run the item again, whatever attempts are left.
//   - retry-after advice: a retryable ApplicationError whose
//     NextRetryDelay is the advice (at most [MaxRetryDelay]), so the next
//     run starts no sooner than the provider said.
//   - otherwise (a *Cancelled that Temporal did not ask for, such as a
//     worker shutting down, included): a retryable ApplicationError, and
//     Temporal's retry policy decides.
//
// The ApplicationError's message is the error's text, its type names the
// outcome ([TypeExhausted], [TypeTruncated], [TypeTimedOut],
// [TypeCancelled]), and its details are the chain's JSON record (what
// json.Marshal of the error gives: outcome, item_retryable, error,
// attempts), then the [Runs] before this one, read from the heartbeat
// details when there are any; a CanceledError carries the same two
// details. The first decodes into a json.RawMessage, a map or a struct of
// your own, so workflow code and Temporal's UI show every attempt.
//
// An err that holds none of the chain's errors is returned unchanged when
// it advises nothing, and otherwise as an ApplicationError with its
// redacted text ([llmretry.Redact]) and the type name Temporal would give
// it, non-retryable or with a next retry delay as its advice says. nil
// gives nil, and an error of Temporal's own is returned unchanged.
func ActivityError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	runs := EarlierRuns(ctx)
	if runs.Run == 0 {
		runs = Runs{Run: 1, Earlier: []json.RawMessage{}} // not an activity's context: as a first run
	}
	return activityError(ctx, err, runs)
}

// activityError is ActivityError with the runs before this one known.
func activityError(ctx context.Context, err error, runs Runs) error {
	if err == nil {
		return nil
	}
	var (
		app      *temporal.ApplicationError
		canceled *temporal.CanceledError
	)
	if errors.As(err, &app) || errors.As(err, &canceled) {
		return err // mapped already
	}
	o, typ, ok := outcomeOf(err)
	if !ok {
		return foreignError(err)
	}
	record, jerr := json.Marshal(o)
	if jerr != nil {
		// Not reached for the chain's records, whose only failure is a
		// start time outside years 0 to 9999; keep the text.
		record, _ = json.Marshal(struct {
			Error string `json:"error"`
		}{o.Error()})
	}
	details := []any{json.RawMessage(record), runs}
	if typ == TypeCancelled && cancelledByTemporal(ctx) {
		return temporal.NewCanceledError(details...)
	}
	opts := temporal.ApplicationErrorOptions{NonRetryable: !llmretry.RetryItem(err), Details: details}
	if !opts.NonRetryable {
		opts.NextRetryDelay = retryDelay(err)
	}
	return temporal.NewApplicationErrorWithOptions(o.Error(), typ, opts)
}

// outcome is what the chain's four errors have in common.
type outcome interface {
	error
	json.Marshaler
	llmretry.ItemRetryable
}

// outcomeOf finds the outermost of the chain's four errors in err's tree
// and its type's name; ok is false when there is none.
func outcomeOf(err error) (o outcome, typ string, ok bool) {
	if !errors.As(err, &o) {
		return nil, "", false
	}
	switch o.(type) {
	case *llmretry.Truncated:
		return o, TypeTruncated, true
	case *llmretry.TimedOut:
		return o, TypeTimedOut, true
	case *llmretry.Cancelled:
		return o, TypeCancelled, true
	case *llmretry.Exhausted:
		return o, TypeExhausted, true
	}
	return nil, "", false // another library's error with a record: not ours to name
}

// cancelledByTemporal reports whether Temporal asked to cancel the
// activity whose context ctx is: its context was cancelled with a
// CanceledError as the cause. A worker's shutdown, a pause or a reset
// give other causes, and Temporal takes a cancelled result from the
// activity only when it asked for it.
func cancelledByTemporal(ctx context.Context) bool {
	return ctx != nil && errors.Is(ctx.Err(), context.Canceled) && temporal.IsCanceledError(context.Cause(ctx))
}

// retryDelay is err's retry-after advice, at most MaxRetryDelay; 0 when
// it gives none.
func retryDelay(err error) time.Duration {
	d, ok := llmretry.RetryItemAfter(err)
	if !ok {
		return 0
	}
	return min(d, MaxRetryDelay)
}

// foreignError maps an error that holds none of the chain's: by its
// advice alone, keeping its text (redacted) and Temporal's name for it.
func foreignError(err error) error {
	retry := llmretry.RetryItem(err)
	delay := retryDelay(err)
	if retry && delay == 0 {
		return err // nothing to add: Temporal's own handling
	}
	return temporal.NewApplicationErrorWithOptions(llmretry.Redact(err.Error()), typeName(err),
		temporal.ApplicationErrorOptions{NonRetryable: !retry, NextRetryDelay: delay})
}

// typeName is the name Temporal gives an error's type: its Go type's,
// pointers dereferenced, and "" for errors.New's.
func typeName(err error) string {
	t := reflect.TypeOf(err)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(errors.New("")).Elem() {
		return ""
	}
	return t.Name()
}
