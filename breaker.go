package llmretry

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// DefaultBreakerFailures is how many consecutive retryable failures open a
// [Breaker] whose Failures is zero.
const DefaultBreakerFailures = 5

// DefaultCooldown is how long a [Breaker] whose Cooldown is zero stays
// open before it lets one probe through.
const DefaultCooldown = 30 * time.Second

// Breaker is the health of one backend, shared by every call of every
// Chain that holds the same pointer. Its zero value is ready to use. It is
// safe for concurrent use; copy it only before first use.
//
// A Chain learns nothing across calls without one: during an outage every
// call spends its own retries on a backend that is down. With a Breaker on
// the backend ([Backend.Breaker]):
//
//   - Closed, calls go through. Consecutive failures of [KindTransient] or
//     [KindTimeout], counted across all calls, open it after Failures; a
//     success resets the count. Other Kinds do not count: they are about
//     the request, not the backend's health.
//   - A retry-after hint on such a failure opens it until the hint runs
//     out, whatever the count, for every caller (for no longer than the
//     reporting backend's MaxWait: a hint beyond that is a broken
//     server's).
//   - An attempt ended by its caller's own cancel or deadline, or by a
//     panic, says nothing about the backend and is not counted.
//   - Open, a call skips the backend without sending anything, and records
//     the skip as an attempt (Skipped, Why "breaker"). When the backend is
//     the last one the call can try, it waits instead, within the bound
//     that [Backend.Breaker] states, and stops when the bound is not
//     enough. A call that skipped it may come back to it, as
//     Backend.Breaker says.
//   - Half-open, after the open period, one call at a time goes through as
//     a probe while others skip or wait. A transient or timeout failure
//     opens it again for Cooldown, or until its own retry-after. An
//     outcome that says nothing about the backend (the caller's cancel or
//     deadline, a panic, a Call reporting its own withdrawal) leaves it
//     half-open, and the next call probes. Any other outcome closes it, a
//     refusal of the request included: the backend is up. Among waiting
//     calls, the one whose Do began first gets the probe, so outcomes do
//     not depend on goroutine scheduling.
//   - When it closes while calls wait for it, they go in the same order,
//     one millisecond apart: let go together, they would reach the backend
//     at one instant, and which of them a rate-limited backend answered
//     would depend on which goroutine ran first.
//   - A success of an attempt sent before the breaker opened closes it
//     too, open or half-open (or hands it to the waiting calls): the
//     backend has just answered.
//
// Failures and Cooldown are read without the lock: set them before the
// breaker's first use and do not change them after.
type Breaker struct {
	Failures int           // consecutive failures of a retryable Kind, across calls, that open it; 0 means 5
	Cooldown time.Duration // how long it stays open before one probe may go through; 0 means 30s

	mu      sync.Mutex
	fails   int              // consecutive retryable failures
	until   time.Time        // open until then; zero when closed
	kind    Kind             // the Kind of the failure that opened it
	hinted  bool             // a retry-after hint set until: the provider said when it would be back
	probing bool             // a probe is in flight
	waiters []*breakerWaiter // calls waiting to send, the earliest-begun first
	changed chan struct{}    // closed when the state changes; nil until a call waits on it
	seq     uint64           // orders waiters whose calls began at the same time
	opened  int              // times it has opened, for BreakerState.Opened
}

// BreakerState is a reading of a [Breaker], for dashboards.
type BreakerState struct {
	Open     bool      // calls skip the backend, or wait for it when it is their last
	Until    time.Time // when it half-opens; zero when closed
	Failures int       // consecutive retryable failures counted so far
	Probing  bool      // a half-open probe is in flight
	Kind     Kind      // the Kind of the failure that opened it; KindUnknown when closed
	Opened   int       // times it went from closed or half-open to open since it was made: a counter for alerts
}

// State reads the breaker's state. A breaker past its open period is
// still Open until a probe answers, with Until in the past.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until.IsZero() {
		return BreakerState{Failures: b.fails, Opened: b.opened}
	}
	return BreakerState{Open: true, Until: b.until, Failures: b.fails, Probing: b.probing, Kind: b.kind, Opened: b.opened}
}

// openPast reports whether the breaker will still be open at t, as far as
// is known now. A nil Breaker never is.
func (b *Breaker) openPast(t time.Time) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.until.After(t)
}

// breakerWaiter is a call in a breaker's line.
type breakerWaiter struct {
	start time.Time // when the call's Do began: the line's order
	ready time.Time // when the call comes to the breaker; until then it holds no one up
	turn  time.Time // when a closing breaker let it go: it sends no earlier
	seq   uint64
}

// verdict is a breaker's answer to a call that wants to send.
type verdict struct {
	pass    bool            // send now
	held    bool            // closed, but the call's turn comes at until: wait for it
	probe   bool            // as the half-open probe: report how it went
	until   time.Time       // when it half-opens; zero while someone else probes
	kind    Kind            // what opened it
	hinted  bool            // a retry-after hint set its open period
	changed <-chan struct{} // closed when the state changes
}

// admit answers a call that wants to send at now; w is the call's place
// among the waiters, nil when it is not waiting.
func (b *Breaker) admit(now time.Time, w *breakerWaiter) verdict {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.until.IsZero() && w != nil && w.turn.After(now):
		return verdict{held: true, until: w.turn, changed: b.notifier()}
	case b.until.IsZero():
		return verdict{pass: true}
	case now.Before(b.until):
		return verdict{until: b.until, kind: b.kind, hinted: b.hinted, changed: b.notifier()}
	case b.probing || b.first(now) != w:
		// Half-open, but the probe is someone else's: the waiting call
		// that began first goes before anyone who just arrived.
		return verdict{kind: b.kind, hinted: b.hinted, changed: b.notifier()}
	}
	b.probing = true
	return verdict{pass: true, probe: true}
}

// first is the waiter whose turn it is at now: the earliest-begun of those
// that have come to the breaker; nil when none has.
func (b *Breaker) first(now time.Time) *breakerWaiter {
	for _, w := range b.waiters {
		if !w.ready.After(now) {
			return w
		}
	}
	return nil
}

// join puts a call, begun at start, in the line, to come to the breaker
// at ready.
func (b *Breaker) join(start, ready time.Time) *breakerWaiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	w := &breakerWaiter{start: start, ready: ready, seq: b.seq}
	i, _ := slices.BinarySearchFunc(b.waiters, w, func(x, y *breakerWaiter) int {
		if c := x.start.Compare(y.start); c != 0 {
			return c
		}
		return cmp.Compare(x.seq, y.seq)
	})
	b.waiters = slices.Insert(b.waiters, i, w)
	return w
}

// leave takes a call out of the waiters, and lets the next one try.
func (b *Breaker) leave(w *breakerWaiter) {
	if w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.waiters, w); i >= 0 {
		b.waiters = slices.Delete(b.waiters, i, i+1)
		b.wake()
	}
}

// observe records how an attempt that the breaker admitted went: ok for a
// success, else its Kind and retry-after hint (KindCancelled when nothing
// was learned about the backend). probe says whether it was the half-open
// probe; maxWait caps how long a hint may hold it open (a non-positive
// maxWait, none).
func (b *Breaker) observe(now time.Time, ok bool, kind Kind, hint time.Duration, probe bool, maxWait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	defer b.wake()
	switch {
	case ok:
		b.answered(now)
	case kind == KindCancelled:
		// The caller withdrew, or its own deadline ended the attempt:
		// nothing was learned about the backend. A probe's turn passes to
		// the next call.
	case aboutHealth(kind) && hint > 0:
		b.fails++
		if maxWait > 0 {
			hint = min(hint, maxWait)
		}
		b.open(now, hint, kind, true)
	case aboutHealth(kind):
		b.fails++
		if probe || b.fails >= cmp.Or(b.Failures, DefaultBreakerFailures) {
			b.open(now, cmp.Or(b.Cooldown, DefaultCooldown), kind, false)
		}
	case probe:
		// The backend answered, if not with what was asked: it is up.
		b.answered(now)
	}
}

// answered records that the backend answered at now: it is up, and the
// breaker closes. The calls waiting for it get their turns, in line
// order, handOff apart.
func (b *Breaker) answered(now time.Time) {
	if !b.until.IsZero() {
		turn := now
		for _, w := range b.waiters {
			if !w.ready.After(now) {
				w.turn = turn
				turn = turn.Add(handOff)
			}
		}
	}
	b.fails, b.until, b.hinted = 0, time.Time{}, false
}

// handOff is the time between the turns of the calls that a closing
// breaker lets go: enough to put them in order, too little to matter next
// to a model's answer.
const handOff = time.Millisecond

// open keeps the breaker open for at least d from now; hinted says that d
// is a retry-after hint.
func (b *Breaker) open(now time.Time, d time.Duration, kind Kind, hinted bool) {
	until := now.Add(min(d, maxOpen))
	if !now.Before(b.until) {
		// Closed (a zero until) or half-open: this opens it.
		b.opened++
	}
	if until.After(b.until) {
		b.until, b.kind, b.hinted = until, kind, hinted
	}
}

// maxOpen bounds how long anything holds a breaker open, so that adding it
// to a time cannot overflow.
const maxOpen = 100 * 365 * 24 * time.Hour

// notifier returns the channel that the next change of state closes.
func (b *Breaker) notifier() <-chan struct{} {
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	return b.changed
}

// wake tells every call waiting on the breaker that its state changed.
func (b *Breaker) wake() {
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}
