// Package temporalretry provides the glue between an [llmretry.Chain] and
// Temporal (go.temporal.io/sdk), the durable-execution engine: a chain
// runs inside an activity, its error tells Temporal's retries what the
// chain's advice says, its heartbeats keep a long stream alive while a
// dead worker is caught, and an item that failed for good goes to a
// dead-letter activity with every run's records.
//
// # What a failed run becomes
//
// [Do] runs a chain inside an activity; [ActivityError] maps its error
// onto Temporal's by the advice in the error ([llmretry.RetryItem],
// [llmretry.RetryItemAfter]):
//
//	the chain's error                       the activity returns                           Temporal
//	nil                                     nil                                            completes the activity
//	*llmretry.Cancelled, Temporal asked     temporal.CanceledError(record, runs)           records it cancelled
//	RetryItem false (e.g. *Truncated)       ApplicationError, NonRetryable                 fails it at once, whatever attempts are left
//	retry-after advice                      ApplicationError, NextRetryDelay = the advice  retries it no sooner than the provider said
//	anything else (a worker's shutdown too) ApplicationError                               retries it by the retry policy
//
// The ApplicationError's Type() names the outcome ([TypeExhausted],
// [TypeTruncated], [TypeTimedOut], [TypeCancelled]), so workflow code can
// branch on it, and its details are the chain's JSON record (outcome,
// item_retryable, error, attempts: what every model said, attempt by
// attempt), then the [Runs] before this one, so that the workflow,
// Temporal's UI and the event history show them.
//
// # Installing it
//
// In the worker, an activity calls Do, and the workflow gives it a retry
// policy, a HeartbeatTimeout and a deadline:
//
//	func (a *Activities) Summarize(ctx context.Context, item Item) (string, error) {
//		return temporalretry.Do(ctx, a.Chain, item.Prompt)
//	}
//
//	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
//		StartToCloseTimeout: 2 * time.Minute,  // each run's deadline: the chain's deadline
//		HeartbeatTimeout:    20 * time.Second, // longer than a backend's StallTimeout, or its Timeout if it does not stream
//		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
//	})
//
// # The dead-letter path
//
// An item whose activity failed for good — its error advised against
// running it again, or the retry policy ran out — is dead. [DeadLetterOf]
// turns the activity's error into a [DeadLetter] with the same keys and
// why values as a batch dead letter ("not_retryable", "runs_used"), and
// the workflow routes it to a dead-letter activity (or signals it to a
// workflow that keeps them):
//
//	var answer string
//	err := workflow.ExecuteActivity(ctx, acts.Summarize, item).Get(ctx, &answer)
//	if dl, ok := temporalretry.DeadLetterOf(item.ID, err); ok {
//		err = workflow.ExecuteActivity(ctx, acts.DeadLetter, dl).Get(ctx, nil)
//	}
//
// A cancelled item is not dead (DeadLetterOf reports false): it was not
// run to its end.
//
// # Heartbeats
//
// A chain inside an activity heartbeats while it waits (for a retry, or
// for a breaker), every quarter of the activity's HeartbeatTimeout, and
// while a stream makes progress: each [llmretry.Delivered] or
// [llmretry.Progress] call of a backend, heard through
// [llmretry.OnProgress], heartbeats as often at most. A request in flight
// that makes no progress does not heartbeat, so the HeartbeatTimeout is
// the longest a run may go silent: a healthy stream of any length keeps
// its run alive, while a worker that died, or a request that hangs, is
// caught after the HeartbeatTimeout, and Temporal runs the item again,
// on another worker if this one is gone. Set the HeartbeatTimeout above
// the longest a backend may go without output — its StallTimeout for a
// stream, its Timeout for a call that does not stream — or such a call is
// cut. Heartbeats also carry Temporal's cancellation to the activity:
// while a request is silent, a cancellation waits for it to end.
//
// # Where the next run starts
//
// Each heartbeat's details hold the records so far: the records of the
// earlier runs ([Runs]), and this run's record as it would be should the
// run end now without a word — a [llmretry.TimedOut] with its attempts so
// far and, when a request is in flight, one more attempt for that request:
// of kind timeout, with the error "no answer seen", since nobody saw how
// it ended. The next run of the same activity reads them, and starts where
// they say:
//
//   - the records carry over: the failure the next run returns holds them
//     in its Runs, and a dead letter in its "earlier", so that every
//     request the provider saw is in the records, the one a dead worker
//     left in flight included;
//   - when the last record says every backend asked for time (a run that
//     died while its chain waited on a retry-after), the next run waits,
//     heartbeating, until that time has come, as long as it comes before
//     the activity's deadline, and only then sends;
//   - the chain itself starts afresh: its first backend, its first try, a
//     new deadline. The records are history, not a position in the chain:
//     what the breakers know of the backends is in the [llmretry.Breaker]s
//     (shared across workers with a store), and a request whose answer was
//     not seen must be sent again anyway.
//
// The SDK sends heartbeats at most every 0.8 of the HeartbeatTimeout and
// keeps the latest details in between; a worker stopped with Worker.Stop
// sends them, but one killed outright loses the details of that interval,
// so a request it sent in it is missing from the records. Set the
// worker's MaxHeartbeatThrottleInterval lower where that matters.
//
// # Sizes
//
// The records travel in heartbeat details and in failures, which Temporal
// limits (2 MB per payload by default, with a warning at 512 KB). Each
// attempt keeps up to Chain.MaxRawText bytes of the model's output (64
// KiB by default) and a failure holds this run's attempts and up to
// batch.KeptRuns-1 earlier runs': set MaxRawText to a few KiB for chains
// that run inside activities.
//
// # Concurrency
//
// Do, ActivityError and DeadLetterOf keep no state between calls: every
// run's state lives in its heartbeat details and its error. Do is safe
// for concurrent use with one Chain, as Chain.Do is.
package temporalretry
