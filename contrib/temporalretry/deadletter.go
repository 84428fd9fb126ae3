package temporalretry

import (
	"encoding/json"
	"errors"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// DeadLetter is the record of an item whose activity failed for good, as
// workflow code builds it with [DeadLetterOf] and hands it to a
// dead-letter activity or signal. It encodes to the JSON of a batch dead
// letter ([batch.DeadLetter]), with the same keys and the same why
// values, so one table or file takes the dead letters of both:
//
//	{"id": ..., "why": "not_retryable" | "runs_used", "runs": ..., "error": ..., "earlier": [...], "omitted": ...}
//
// It holds no request, which may be large or private; the ID finds it.
type DeadLetter struct {
	ID string `json:"id"`
	// Why is batch.WhyNotRetryable when the last run's error advised
	// against running the item again (or the retry policy lists its
	// type as not retryable), and batch.WhyRunsUsed when Temporal's retry
	// policy ran out: its MaximumAttempts, or its ScheduleToCloseTimeout.
	Why batch.Why `json:"why"`
	// Runs is the number of runs (activity attempts) the records know
	// of: the last run's, or 1 when the error carries no [Runs].
	Runs int `json:"runs"`
	// Error is the last run's JSON record: the chain's record of its
	// error, the record its heartbeats left when it timed out, or
	// {"error": text} for an error that has no record.
	Error json.RawMessage `json:"error"`
	// Earlier and Omitted are the [Runs] before the last, as the last
	// run knew them. Earlier is never null.
	Earlier []json.RawMessage `json:"earlier"`
	Omitted int               `json:"omitted"`
}

// DeadLetterOf returns the dead letter of the item whose ID is id, when
// err, the error of the item's activity as workflow code gets it from the
// activity's future, says that the activity failed for good; ok is false
// for a nil err, for a cancellation (a cancelled item is not dead: it was
// not run to its end, as batch reports such items as not run) and for an
// error that is not an activity's.
//
//	var answer string
//	err := workflow.ExecuteActivity(ctx, acts.Summarize, item).Get(ctx, &answer)
//	if dl, ok := temporalretry.DeadLetterOf(item.ID, err); ok {
//		return workflow.ExecuteActivity(ctx, acts.DeadLetter, dl).Get(ctx, nil)
//	}
//
// It reads the records that [Do] and [ActivityError] put in the failure's
// details, or, for a last run that timed out (its heartbeat, or its start
// to close), in its last heartbeat's details. It is deterministic, as
// workflow code must be: it reads only err.
func DeadLetterOf(id string, err error) (dl DeadLetter, ok bool) {
	var actErr *temporal.ActivityError
	if err == nil || !errors.As(err, &actErr) || temporal.IsCanceledError(err) {
		return DeadLetter{}, false
	}
	dl = DeadLetter{ID: id, Why: batch.WhyRunsUsed, Runs: 1, Earlier: []json.RawMessage{}}
	if actErr.RetryState() == enumspb.RETRY_STATE_NON_RETRYABLE_FAILURE {
		dl.Why = batch.WhyNotRetryable
	}

	var (
		record  json.RawMessage
		runs    Runs
		app     *temporal.ApplicationError
		timeout *temporal.TimeoutError
		l       ledger
	)
	switch {
	case errors.As(err, &app):
		if app.NonRetryable() {
			dl.Why = batch.WhyNotRetryable
		}
		if app.Details(&record, &runs) != nil || !json.Valid(record) {
			record, runs = nil, Runs{}
		}
	case errors.As(err, &timeout):
		if timeout.LastHeartbeatDetails(&l) == nil && l.V == ledgerVersion && json.Valid(l.Record) {
			record, runs = l.Record, l.Runs
		}
	}
	if record == nil {
		cause := actErr.Unwrap()
		if cause == nil {
			cause = actErr
		}
		record, _ = json.Marshal(struct {
			Error string `json:"error"`
		}{llmretry.Redact(cause.Error())})
	}
	dl.Error = record
	if runs.Run > 0 {
		dl.Runs = runs.Run
		dl.Omitted = runs.Omitted
		if runs.Earlier != nil {
			dl.Earlier = runs.Earlier
		}
	}
	return dl, true
}
