// Package batch provides a runner that sends many items through one
// [llmretry.Chain] with bounded concurrency, and routes each failure by
// the advice the chain's errors carry: run the item again now, run it
// again later, or put it in the dead letters with its full record.
//
//	r := &batch.Runner[Prompt, Answer]{
//		Chain:    chain,
//		OnResult: func(item batch.Item[Prompt], a Answer) { save(item.ID, a) },
//		Dead:     batch.JSONLines(deadFile),
//	}
//	counts, err := r.Run(ctx, slices.Values(items))
//
// # Routing
//
// Each run of an item is one [llmretry.Chain.Do]. Its result goes, in this
// order:
//
//	success                                   OnResult
//	llmretry.RetryItem(err) == false          a dead letter at once, WhyNotRetryable: no re-run can help
//	the context is done                       not run (OnNotRun): never dead
//	Runs used up                              a dead letter, WhyRunsUsed
//	otherwise                                 run again after llmretry.RetryItemAfter(err),
//	                                          or else after the runner's own Waits
//
// A run in which the chain skipped every backend for its breaker sent
// nothing, and does not use up one of the item's Runs: the item runs
// again when the soonest breaker lets a probe through, as the error's
// RetryItemAfter says (or after the runner's own wait when a breaker's
// probe is in flight, which gives no time).
//
// The context is the runner's: a [*llmretry.Cancelled] that a backend
// reported while the runner's context was still live is routed like any
// other retryable failure, so one backend's confused withdrawal costs the
// item a run, not the whole batch.
//
// # Dead letters
//
// [JSONLines] writes each dead letter as a line of JSON: the item's ID,
// why it is dead, its runs and each kept run's error as the chain's JSON
// record of it. [ReadDeadLetters] reads such a file back into
// [DeadLetter] values whose errors are the chain's typed errors again
// (see [llmretry.DecodeError]), so that a later job can pick the items
// worth running again by llmretry.RetryItem and llmretry.RetryItemAfter;
// the command github.com/llmretry/llmretry/cmd/llmretry summarises a
// file and lists those items.
//
// # Counts
//
// Every item taken from the iterator ends exactly once, as succeeded, dead
// or not run, and [Counts] add up to the items taken. Run stops taking
// items once the context is done (or a [Sink] has failed), so an endless
// iterator is fine: items it never yielded are the caller's, and appear
// in no count. An item is not run when the context ended before it could
// finish: while it waited for a slot, waited between runs, or during a run
// that then failed in a way another run might have cured.
//
// # Timing
//
// Run takes an item from the iterator only when a concurrency slot is free
// for its first run, so that it seldom holds an item it could not start,
// and holds no slot while the iterator runs, which may block. A waiting
// item, between runs, holds no slot: other items run meanwhile, and it
// queues for a slot again when its wait is over. Waits end at once
// when the context is done. Runner.Pending bounds the items taken and not
// yet ended, running or waiting, so that a provider-wide outage cannot
// pull an endless iterator into memory.
//
// # Errors
//
// Run returns nil when every item taken has ended and the iterator ran
// out, whatever the items' outcomes: those are in the counts, the results
// and the dead letters. It returns an error when the runner is set up
// wrong (before any item is taken; it wraps [llmretry.ErrConfig]), when a
// Sink fails (the first such error; Run then stops as if cancelled), or
// when the context ended before the work was done (the error then matches
// the context's error and its cause with errors.Is).
//
// # Concurrency
//
// Run calls OnResult, OnNotRun, OnProgress and the Sink's Put one at a
// time, never concurrently (nor concurrently with another Run of the same
// Runner), from goroutines it starts, and returns only when every
// goroutine it started has ended: no callback runs after Run returns. A slow callback holds up the reporting of the other items, not
// their calls. A Runner must not be changed while Run is running; one
// Runner may run several batches, one after another or at once.
package batch
