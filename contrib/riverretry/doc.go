// Package riverretry provides the glue between an [llmretry.Chain] and
// River (github.com/riverqueue/river), a job queue on PostgreSQL: any
// number of worker processes on any number of machines share one jobs
// table, and each job that runs a chain ends the way the chain's advice
// says, with what every model said kept in the database.
//
// # What a failed run becomes
//
// [Adapter] maps the error of a run onto River's API by the advice in the
// error ([llmretry.RetryItem], [llmretry.RetryItemAfter]):
//
//	the run's error                          River gets                    the job
//	nil                                      nil                           completed
//	*llmretry.Cancelled (River is stopping)  the error unchanged           available again, no attempt used, no error stored
//	RetryItem false (e.g. *Truncated)        river.JobCancel(*Error),      cancelled at once, whatever attempts are left
//	                                         or *Error for ErrorHandler
//	retry-after advice, snoozes left         river.JobSnooze(advice)       scheduled after the advice, no attempt used
//	anything else                            *Error                        retried by River's RetryPolicy, discarded at MaxAttempts
//
// A job is snoozed at most MaxSnoozes times ([DefaultMaxSnoozes]),
// counted in its metadata; after that its runs' errors go to River as
// they are, so a provider that answers 429 forever uses up the attempts
// and the job is discarded at MaxAttempts. River's own "snoozes" count is
// not used for the limit, since it counts every snooze, whoever asked for
// it.
//
// # Installing it
//
// As a worker middleware, so that existing workers need no change: their
// Work returns the chain's error as it is.
//
//	adapter := &riverretry.Adapter{CancelByHandler: true}
//	config := &river.Config{
//		Middleware:   []rivertype.Middleware{adapter},
//		ErrorHandler: &riverretry.ErrorHandler{},
//		// ...
//	}
//
// Or as a function on a worker's return value:
//
//	_, err := chain.Do(ctx, job.Args.Prompt)
//	return adapter.Result(ctx, job.JobRow, err)
//
// Both together are harmless: Result leaves an error it has mapped alone.
//
// River has two ways to cancel a job, and they store different text.
// river.JobCancel, which the zero Adapter uses, needs nothing else
// installed, but River stores the run's error entry as "JobCancelError: "
// followed by the record. [ErrorHandler], installed as
// river.Config.ErrorHandler, cancels with SetCancelled instead, and the
// entry is the record alone. Use the handler, with CancelByHandler set on
// the Adapter, wherever you control the client's Config; keep JobCancel
// where you do not, or where the worker calls Result but another team owns
// the handler (which can still be wrapped: ErrorHandler.Next).
//
// # What River keeps
//
// River stores the Error text of every failed or cancelled run in the
// job's errors column. [*Error], which the adapter returns, has as its
// text the JSON record of the chain's typed error — json.Marshal of it:
// outcome, item_retryable, the summary and every attempt with its kind,
// status, the model's raw output, retry-after and timing — so the table
// answers what every model said, attempt by attempt:
//
//	SELECT id, state, e->>'attempt' AS attempt,
//	       (e->>'error')::jsonb->>'outcome' AS outcome,
//	       (e->>'error')::jsonb->'attempts' AS attempts
//	FROM river_job, unnest(errors) AS e
//	WHERE kind = 'summarize';
//
// (Entries written through river.JobCancel start with "JobCancelError: "
// and are not JSON as they stand.) A snoozed run stores no error, and
// neither does a run cut short by the client's shutdown; the adapter
// records those in the job's metadata under [MetadataKey]: its snooze
// count, its cancellation count, and the last snoozed run's record
// ([Metadata], read with [JobMetadata]).
//
// # Timing
//
// River cancels a run's context after JobTimeout (river.Config.JobTimeout,
// or the worker's Timeout; one minute by default), and a chain run with
// that context takes it as its deadline. Under a deadline, a chain repeats
// a backend's last wait for as long as the wait ends at least
// Policy.Reserve before the deadline, so one run against a failing
// provider keeps trying for about JobTimeout minus the reserve. Choose the
// three together:
//
//   - JobTimeout is one run's budget: how long it may keep trying, plus
//     the reserve. The whole job's budget is about MaxAttempts runs, with
//     River's retry backoff between them, plus its snoozes.
//   - Set Policy.Reserve explicitly, to a few seconds. Left zero it is
//     half of the time left, at most 60s: 30s of River's default minute,
//     which a job, with nothing to do after the chain returns, would
//     waste. The reserve also decides which retry-after hints become
//     snoozes: a wait that would end inside the reserve ends the run
//     instead, with the advice to come back later, and the job is
//     snoozed without using an attempt. Policy.MaxWait does the same for
//     any hint longer than it.
//   - Give each backend a Timeout well under JobTimeout minus the
//     reserve, so that one hung request cannot use up the run and leave
//     no time to fail over. A run that does reach JobTimeout ends as
//     [*llmretry.TimedOut], which River retries.
//
// With JobTimeout -1 (no deadline), the chain makes exactly the waits its
// policies list, and only the backends' Timeouts bound a run; see below
// for what that costs when a process is killed.
//
// # Shutdown and crashes
//
// Client.Stop waits for running jobs; StopAndCancel, or a Stop whose
// SoftStopTimeout runs out, cancels their contexts. A chain then returns
// [*llmretry.Cancelled], the adapter returns it unchanged, and River,
// seeing its own shutdown behind a context.Canceled, puts the job back as
// available without using up an attempt and without storing an error;
// another client picks it up. The adapter counts the cancellation in the
// job's metadata. A chain that honours its context (every Call returns
// soon after its context ends, as net/http does) makes this prompt.
//
// A process that is killed outright (SIGKILL, a lost machine) leaves its
// jobs in the running state. River's rescuer, which runs every 30 seconds
// on the client elected leader (any client of the database may be), takes
// a job that has been running longer than river.Config.RescueStuckJobsAfter
// and schedules it for a retry by River's RetryPolicy, with the error
// entry "Stuck job rescued by JobRescuer"; the killed run has used up its
// attempt, and a job with none left is discarded. RescueStuckJobsAfter
// defaults to an hour, or to JobTimeout plus an hour when JobTimeout is
// set, and River refuses a value below JobTimeout. Set it above JobTimeout
// plus River's JobStuckThreshold (10s by default), or a run still going
// may be rescued and the job run twice: a minute above JobTimeout brings
// a killed machine's jobs back within about a minute and a half of the
// kill, plus River's retry backoff. With JobTimeout -1 the rescuer never
// takes a job, so a killed machine's jobs stay running until someone
// acts. The adapter records nothing for a killed run: it never returned.
//
// # Concurrency
//
// An [Adapter] and an [ErrorHandler] hold only their settings; once set
// up they are safe for concurrent use by every worker of every client.
// All state lives in the jobs' rows.
package riverretry
