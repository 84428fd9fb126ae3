package batch

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/llmretry/llmretry"
	"golang.org/x/sync/errgroup"
)

// Defaults for a [Runner]'s zero fields.
const (
	// DefaultConcurrency is 8 items in flight: enough to hide the seconds
	// an LLM call takes, and few enough to stay inside the request rate of
	// an ordinary API tier. Each item in flight is one request at a time,
	// its chain's retries included, so Concurrency is also the number of
	// requests the runner has open.
	DefaultConcurrency = 8
	// DefaultRuns is 3 runs per item in total: the chain has already
	// retried within each run, so a third run is for an outage that
	// outlasted two.
	DefaultRuns = 3
	// pendingPerSlot is how many items may be taken per concurrency slot
	// when Pending is zero: enough that items waiting between runs leave
	// the slots busy with others, few enough to bound memory.
	pendingPerSlot = 16
)

// DefaultWaits returns the waits between runs that a Runner with nil
// Waits uses: one minute after the first run, five after the second and
// any later. The chain's own waits cover failures that last seconds; a
// second run is for an outage, which lasts minutes. It returns a new slice
// on every call.
func DefaultWaits() []time.Duration { return []time.Duration{time.Minute, 5 * time.Minute} }

// Item is one unit of work: an ID that names it in results and dead
// letters, and the request the chain is given for it. Run does not check
// that IDs are unique.
type Item[Req any] struct {
	ID  string
	Req Req
}

// Counts say how the items taken from the iterator ended. Each item is in
// exactly one count, once it has ended.
type Counts struct {
	Succeeded int // OnResult was called
	Dead      int // a dead letter was given to the Sink
	NotRun    int // the context ended (or a Sink failed) before the item could finish

	// Usage is the total the providers reported over every attempt of
	// every run so far, failed ones and dead items included: what the
	// batch was billed, as far as it is known.
	Usage llmretry.Usage
	// UsageUnknown counts the attempts sent whose cost is unknown: no
	// usage reported and no response seen, such as a timeout, which the
	// provider may have billed (see [llmretry.TotalUsage]). An attempt
	// whose request never reached a provider, such as a refused
	// connection, cost nothing and is not counted.
	UsageUnknown int
}

// Total returns the number of items counted: Succeeded + Dead + NotRun.
func (c Counts) Total() int { return c.Succeeded + c.Dead + c.NotRun }

// String returns the counts as a progress line: "12 items: 10 succeeded,
// 1 dead, 1 not run; tokens 5230 in, 1210 out, 2 attempts of unknown
// cost" (the last part only when there are such attempts).
func (c Counts) String() string {
	s := fmt.Sprintf("%d items: %d succeeded, %d dead, %d not run; tokens %d in, %d out",
		c.Total(), c.Succeeded, c.Dead, c.NotRun, c.Usage.InputTokens, c.Usage.OutputTokens)
	if c.UsageUnknown > 0 {
		s += fmt.Sprintf(", %d attempts of unknown cost", c.UsageUnknown)
	}
	return s
}

// Runner sends items through a Chain, at most Concurrency at a time, and
// routes each item's failures by their advice (see the package
// documentation). Chain and Dead are required; every other field has a
// default for its zero value. A Runner is safe for concurrent Run calls
// once set up, and must not be changed while one is running, nor copied
// after its first Run. Every Run of one Runner calls its callbacks and its
// Sink's Put one at a time, concurrent Runs included.
type Runner[Req, Resp any] struct {
	// Chain runs each item. Required.
	Chain *llmretry.Chain[Req, Resp]

	// Concurrency is the number of items in a run at once. 0 means
	// DefaultConcurrency (8).
	Concurrency int
	// Pending bounds the items taken from the iterator and not yet ended,
	// running or waiting to run again: Run takes no further item while
	// this many are pending. 0 means 16 × Concurrency. A Pending below
	// Concurrency limits the items in a run at once to Pending.
	Pending int
	// Runs is the number of runs per item in total, the first included.
	// 0 means DefaultRuns (3); 1 means no item is run twice. A run in
	// which the chain skipped every backend for its breaker sent nothing,
	// and is not counted: the item runs again when the breaker advises
	// ([llmretry.RetryItemAfter]: when the soonest breaker lets a probe
	// through), as often as it takes.
	Runs int
	// Waits are the runner's own waits before an item's second, third, …
	// run, used when the failure gives no [llmretry.RetryItemAfter]
	// advice; the last one repeats. Nil or empty means [DefaultWaits]: one
	// minute, then five.
	Waits []time.Duration

	// OnResult, when set, is called with each item that succeeded and its
	// response.
	OnResult func(item Item[Req], resp Resp)
	// Dead receives a [DeadLetter] for each item that failed for good.
	// Required: a dead letter is the only record of why an item failed.
	// When Put fails the item still counts as dead, and Run stops taking
	// items and returns an error that names it.
	Dead Sink
	// OnNotRun, when set, is called with each item taken that the context
	// kept from finishing, and the error of its last run (nil when it
	// never ran), so that the caller can run those items again later.
	OnNotRun func(item Item[Req], last error)
	// OnProgress, when set, is called after every item has ended, with
	// the counts so far: the nth call's counts add up to n, and the last
	// call's equal the counts Run returns.
	OnProgress func(Counts)

	// callbacks is held while a callback runs, by every Run of this
	// Runner that is running, so that concurrent Runs call them one at a
	// time too; running counts those Runs, and mu guards both. The lock
	// is a channel of one token, not a sync.Mutex: a goroutine waiting on
	// a channel is durably blocked in a testing/synctest bubble, so a
	// callback that sleeps in virtual time (a slow sink in a user's test)
	// does not stall the bubble's clock. It is made anew when a Run
	// starts and none is running, since a channel made in one bubble may
	// not be used outside it.
	mu        sync.Mutex
	running   int
	callbacks chan struct{}
}

// enter counts a Run in and returns the callback lock it shares with the
// Runs running beside it.
func (r *Runner[Req, Resp]) enter() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == 0 {
		r.callbacks = make(chan struct{}, 1)
	}
	r.running++
	return r.callbacks
}

// leave counts a Run out.
func (r *Runner[Req, Resp]) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running--; r.running == 0 {
		r.callbacks = nil
	}
}

// Run takes items from the iterator (a slice goes in through
// slices.Values; nil means none), runs each through the Chain until it
// succeeds, fails for good or the context ends, and returns how the items
// taken ended. It returns when every item taken has ended and every
// goroutine it started is done. Run stops taking items once ctx is done
// or a Sink has failed; it checks between items, so an iterator that
// blocks must unblock itself (on the same ctx, say). It holds no
// concurrency slot while the iterator runs: items waiting to run again
// go on running while the iterator blocks.
//
// The error is nil when the iterator ran out and every item taken ended;
// otherwise it is the runner's configuration error (wrapping
// [llmretry.ErrConfig], before any item is taken), the first Sink
// failure, or, when the context ended first, an error matching ctx.Err()
// and context.Cause(ctx) with errors.Is.
func (r *Runner[Req, Resp]) Run(ctx context.Context, items iter.Seq[Item[Req]]) (Counts, error) {
	b, err := r.begin()
	if err != nil {
		return Counts{}, err
	}
	b.callbacks = r.enter()
	defer r.leave()
	g, gctx := errgroup.WithContext(ctx)
	b.ctx = gctx

	// A pending slot is taken before an item is pulled, and the iterator
	// is pulled only once a concurrency slot is free, so that an item is
	// seldom pulled that could not start at once: a cancellation then
	// strands as few items as it can. But no concurrency slot is held
	// while the iterator runs, which may block for as long as its source
	// has nothing: an item waiting to run again takes one meanwhile.
	pending := make(chan struct{}, b.pending)
	take := func() bool {
		if gctx.Err() != nil {
			return false // select below picks at random when both are ready
		}
		select {
		case pending <- struct{}{}:
		case <-gctx.Done():
			return false
		}
		if !b.acquire() {
			<-pending
			return false
		}
		<-b.slots // free again: the slot is taken for the item once it is pulled
		return true
	}
	stopped := !take()
	if items == nil {
		items = func(func(Item[Req]) bool) {} // no items, as for an empty slice
	}
	if !stopped {
		for item := range items {
			if !b.acquire() {
				// Taken, so it ends as the others do: not run.
				g.Go(func() error {
					defer func() { <-pending }()
					return b.notRun(item, nil)
				})
				stopped = true
				break
			}
			g.Go(func() error {
				defer func() { <-pending }()
				return b.run(item)
			})
			if !take() {
				stopped = true
				break
			}
		}
		if !stopped {
			<-pending // taken for an item that never came
		}
	}
	// A sink's error is returned by Wait; the items' other outcomes are in
	// the counts.
	sinkErr := g.Wait()

	b.lock()
	b.usageMu.Lock()
	b.counts.Usage, b.counts.UsageUnknown = b.usage, b.usageUnknown
	b.usageMu.Unlock()
	counts := b.counts
	b.unlock()
	switch {
	case sinkErr != nil:
		return counts, sinkErr
	case stopped || counts.NotRun > 0:
		// Only the caller's context is left to have stopped the work.
		return counts, stoppedErr(ctx)
	}
	return counts, nil
}

// begin checks the runner's settings and returns one batch's state.
func (r *Runner[Req, Resp]) begin() (*state[Req, Resp], error) {
	// The errors wrap llmretry.ErrConfig, which advises RetryItem false
	// by itself: a runner set up wrong fails the same way on every run.
	switch {
	case r.Chain == nil:
		return nil, fmt.Errorf("llmretry: batch: chain is nil: %w", llmretry.ErrConfig)
	case r.Dead == nil:
		return nil, fmt.Errorf("llmretry: batch: dead-letter sink is nil: %w", llmretry.ErrConfig)
	case r.Concurrency < 0:
		return nil, fmt.Errorf("llmretry: batch: concurrency %d is negative: %w", r.Concurrency, llmretry.ErrConfig)
	case r.Pending < 0:
		return nil, fmt.Errorf("llmretry: batch: pending %d is negative: %w", r.Pending, llmretry.ErrConfig)
	case r.Runs < 0:
		return nil, fmt.Errorf("llmretry: batch: runs %d is negative: %w", r.Runs, llmretry.ErrConfig)
	}
	for i, w := range r.Waits {
		if w < 0 {
			return nil, fmt.Errorf("llmretry: batch: wait %d is negative: %w", i+1, llmretry.ErrConfig)
		}
	}
	// Without this check every item would end as a dead letter carrying
	// the same configuration error. The chain's error names the backend
	// and wraps ErrConfig already.
	if err := r.Chain.Validate(); err != nil {
		return nil, err
	}
	b := &state[Req, Resp]{r: r, concurrency: r.Concurrency, pending: r.Pending, runs: r.Runs, waits: r.Waits}
	// The batch's own copy of the chain hears every attempt, to total
	// what the run cost; the caller's OnAttempt still hears them all.
	chain := *r.Chain
	hook := chain.OnAttempt
	chain.OnAttempt = func(ctx context.Context, a llmretry.Attempt) {
		b.cost(a)
		if hook != nil {
			hook(ctx, a)
		}
	}
	b.chain = &chain
	if b.concurrency == 0 {
		b.concurrency = DefaultConcurrency
	}
	if b.pending == 0 {
		b.pending = pendingPerSlot * b.concurrency
	}
	if b.runs == 0 {
		b.runs = DefaultRuns
	}
	if len(b.waits) == 0 {
		b.waits = DefaultWaits()
	}
	b.slots = make(chan struct{}, b.concurrency)
	return b, nil
}

// state is what one Run call keeps.
type state[Req, Resp any] struct {
	r           *Runner[Req, Resp]
	ctx         context.Context // the errgroup's: done when the caller's is, or a Sink failed
	concurrency int
	pending     int
	runs        int
	waits       []time.Duration
	slots       chan struct{} // one token per item in a run
	chain       *llmretry.Chain[Req, Resp]

	callbacks chan struct{} // the Runner's callback lock, shared with the Runs beside this one

	usageMu      sync.Mutex // guards usage and usageUnknown, added to apart from the callbacks' lock
	usage        llmretry.Usage
	usageUnknown int

	counts Counts // guarded by the callback lock
}

// lock takes the callback lock, which also guards counts.
func (b *state[Req, Resp]) lock() { b.callbacks <- struct{}{} }

// unlock lets the callback lock go.
func (b *state[Req, Resp]) unlock() { <-b.callbacks }

// run takes one item through its runs and ends it; the error is a Sink's.
// The caller has taken a concurrency slot for the first run.
func (b *state[Req, Resp]) run(item Item[Req]) error {
	var (
		err     error   // the last run's
		runs    int     // the runs that sent a request
		earlier []error // the errors of the runs before the last that a dead letter keeps
		omitted int     // the runs left out of earlier
	)
	dead := func(why Why) error {
		return b.dead(DeadLetter{ID: item.ID, Why: why, Runs: runs, Err: err, Earlier: earlier, Omitted: omitted})
	}
	for first := true; ; first = false {
		if !first && !b.acquire() {
			return b.notRun(item, err)
		}
		var resp Resp
		resp, err = b.chain.Do(b.ctx, item.Req)
		<-b.slots
		// A run whose every backend was skipped for its breaker sent
		// nothing: the item's runs are for requests the providers failed,
		// not for waits on a breaker, which advises when to come back.
		sent := !skippedAll(err)
		if sent {
			runs++
		}
		switch {
		case err == nil:
			return b.succeed(item, resp)
		case !llmretry.RetryItem(err):
			// Before the context check: the item's verdict is in, and a
			// re-run would fail the same way whenever it came.
			return dead(WhyNotRetryable)
		case b.ctx.Err() != nil:
			// The failure may be the cancellation's doing, so it says
			// nothing about the item.
			return b.notRun(item, err)
		case sent && runs >= b.runs:
			return dead(WhyRunsUsed)
		}
		if sent {
			earlier = append(earlier, err)
			if len(earlier) == KeptRuns {
				// Room for the last run's: drop the oldest but the first.
				earlier = slices.Delete(earlier, 1, 2)
				omitted++
			}
		}
		wait, ok := llmretry.RetryItemAfter(err)
		if !ok {
			// No advice; after skips only, a breaker whose probe is in
			// flight, which says no time: the wait before the next run.
			wait = b.waits[min(max(runs, 1), len(b.waits))-1]
		}
		if !b.sleep(wait) {
			return b.notRun(item, err)
		}
	}
}

// skippedAll reports whether err is the chain's error of a call that had
// records and skipped every backend for its breaker: it sent nothing.
func skippedAll(err error) bool {
	var attempts []llmretry.Attempt
	var exhausted *llmretry.Exhausted
	var cancelled *llmretry.Cancelled
	switch {
	case errors.As(err, &exhausted): // a Truncated or TimedOut too
		attempts = exhausted.Attempts
	case errors.As(err, &cancelled):
		attempts = cancelled.Attempts
	}
	for i := range attempts {
		if !attempts[i].Skipped {
			return false
		}
	}
	return len(attempts) > 0
}

// acquire takes a concurrency slot, or reports false when the context
// ended first.
func (b *state[Req, Resp]) acquire() bool {
	if b.ctx.Err() != nil {
		return false
	}
	select {
	case b.slots <- struct{}{}:
		return true
	case <-b.ctx.Done():
		return false
	}
}

// sleep waits d, holding no slot, or reports false when the context ended
// first.
func (b *state[Req, Resp]) sleep(d time.Duration) bool {
	if d <= 0 {
		return b.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-b.ctx.Done():
		return false
	}
}

// succeed ends item as a success.
func (b *state[Req, Resp]) succeed(item Item[Req], resp Resp) error {
	b.lock()
	defer b.unlock()
	if b.r.OnResult != nil {
		b.r.OnResult(item, resp)
	}
	b.counts.Succeeded++
	b.progress()
	return nil
}

// dead ends an item as the dead letter d. A failing Sink's error stops the
// batch.
func (b *state[Req, Resp]) dead(d DeadLetter) error {
	b.lock()
	defer b.unlock()
	putErr := b.r.Dead.Put(d)
	b.counts.Dead++
	b.progress()
	if putErr != nil {
		return fmt.Errorf("llmretry: batch: dead letter of item %q not stored: %w", d.ID, putErr)
	}
	return nil
}

// notRun ends item as not run; last is its last run's error, if it ran.
func (b *state[Req, Resp]) notRun(item Item[Req], last error) error {
	b.lock()
	defer b.unlock()
	if b.r.OnNotRun != nil {
		b.r.OnNotRun(item, last)
	}
	b.counts.NotRun++
	b.progress()
	return nil
}

// cost adds what attempt a cost to the run's total.
func (b *state[Req, Resp]) cost(a llmretry.Attempt) {
	u, unknown := llmretry.TotalUsage([]llmretry.Attempt{a})
	b.usageMu.Lock()
	b.usage, b.usageUnknown = b.usage.Add(u), b.usageUnknown+unknown
	b.usageMu.Unlock()
}

// progress reports the counts; the callback lock is held.
func (b *state[Req, Resp]) progress() {
	b.usageMu.Lock()
	b.counts.Usage, b.counts.UsageUnknown = b.usage, b.usageUnknown
	b.usageMu.Unlock()
	if b.r.OnProgress != nil {
		b.r.OnProgress(b.counts)
	}
}

// stoppedErr is Run's error when ctx ended before the work was done. It
// matches both ctx.Err() and the cause, since a cause set with
// WithCancelCause does not match context.Canceled by itself.
func stoppedErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return fmt.Errorf("llmretry: batch: stopped: %w", err)
	}
	return fmt.Errorf("llmretry: batch: stopped: %w: %w", err, cause)
}
