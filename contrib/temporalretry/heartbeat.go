package temporalretry

import (
	"context"
	"encoding/json"
	"runtime"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/llmretry/llmretry"
)

// DefaultHeartbeatEvery is how often [Do] heartbeats while a chain waits
// when the activity has no HeartbeatTimeout: the heartbeats then only
// carry the records and let Temporal's cancellation reach the activity.
const DefaultHeartbeatEvery = 10 * time.Second

// heartbeatEvery is how often a run heartbeats while it waits, and at
// most while a stream makes progress: a quarter of the HeartbeatTimeout,
// so that Temporal, which the SDK tells at most every 0.8 of it, hears
// from a live run before the timeout.
func heartbeatEvery(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		return DefaultHeartbeatEvery
	}
	return max(timeout/4, time.Millisecond)
}

// beater records a run's heartbeats: its records so far in the details,
// on every attempt's start and end, on a stream's progress, and on a
// ticker while no request is in flight. It is safe for concurrent use:
// progress comes from a backend's goroutines.
type beater struct {
	ctx   context.Context // the activity's
	every time.Duration

	mu       sync.Mutex
	runs     Runs
	attempts []llmretry.Attempt
	inFlight *sending // the request in flight; nil between requests
	last     time.Time
}

// newBeater returns the beater of the run that runs know of.
func newBeater(ctx context.Context, runs Runs) *beater {
	return &beater{
		ctx:   ctx,
		every: heartbeatEvery(activity.GetInfo(ctx).HeartbeatTimeout),
		runs:  runs,
	}
}

// record heartbeats the records as they stand. b.mu is held.
func (b *beater) record(now time.Time) {
	attempts := b.attempts
	if b.inFlight != nil {
		attempts = append(attempts[:len(attempts):len(attempts)], lostAttempt(*b.inFlight, now))
	}
	// What the run's record is should it end now without a word: it ran
	// out of time, as far as Temporal will know.
	record, err := json.Marshal(&llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attempts}})
	if err != nil {
		return // a start time outside years 0 to 9999: keep the last heartbeat's records
	}
	b.send(ledger{V: ledgerVersion, Runs: b.runs, Record: record}, now)
}

// send records l as the heartbeat's details. b.mu is held.
func (b *beater) send(l ledger, now time.Time) {
	activity.RecordHeartbeat(b.ctx, l)
	b.last = now
}

// start is the chain's OnAttemptStart: a request is about to be sent.
func (b *beater) start(backend int, model string, try int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.inFlight = &sending{backend: backend, model: model, try: try, start: now}
	b.record(now)
}

// end is the chain's OnAttempt: an attempt ended, or was skipped.
func (b *beater) end(a llmretry.Attempt) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inFlight = nil
	if a.Err == nil {
		return // a success: the run returns its answer, and needs no record
	}
	b.attempts = append(b.attempts, a)
	b.record(time.Now())
}

// progress is the chain's OnProgress hook: a stream delivered output or
// made progress. It heartbeats at most every b.every.
func (b *beater) progress() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now := time.Now(); now.Sub(b.last) >= b.every {
		b.record(now)
	}
}

// tick heartbeats when no request is in flight: the chain is waiting
// (for a retry, or for a breaker), or between its steps. A request in
// flight heartbeats by its progress alone, so a stream that stalls, or a
// worker that died, stops the heartbeats.
func (b *beater) tick() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight == nil {
		b.record(time.Now())
	}
}

// ended heartbeats the run's own outcome, record, as it returns its error.
func (b *beater) ended(record json.RawMessage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ctx := b.ctx
	if ctx.Err() != nil {
		// The SDK sends a heartbeat under the context it is given, and the
		// activity's is done (a worker shutting down, mostly): the run's
		// own record would be lost, and the next run would read the guess
		// of its last heartbeat instead. The SDK bounds the send itself.
		// Should it keep the details for later, past the run's end, they
		// are lost all the same, and the guess stands.
		ctx = context.WithoutCancel(ctx)
	}
	l := ledger{V: ledgerVersion, Runs: b.runs, Record: record, Ended: true}
	// Twice: the SDK batches heartbeats (temporalInvoker.Heartbeat in
	// go.temporal.io/sdk v1.51.0; check again on an upgrade), and its
	// batching goroutine may have taken an earlier heartbeat's details to
	// send just as this one went out at once; the earlier is then buffered
	// after this one, flushed as the activity fails, and kept by Temporal,
	// so the next run would read its guess instead of the outcome. That
	// goroutine waits on the SDK's lock through this one's send; yielding
	// lets it take the lock first, so that the second call comes after it
	// and is what the SDK flushes. It costs one more heartbeat as the run
	// fails. The SDK offers no way to wait for its goroutine, so this makes
	// the race rare, not impossible; nor does it help when that goroutine
	// takes both calls' details and its send races the activity's failure.
	activity.RecordHeartbeat(ctx, l)
	runtime.Gosched()
	activity.RecordHeartbeat(ctx, l)
	b.last = time.Now()
}

// run ticks every b.every until stop is closed.
func (b *beater) run(stop <-chan struct{}) {
	t := time.NewTicker(b.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			b.tick()
		}
	}
}
