package llmretry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"time"
)

// BreakerStore keeps the [SharedState] of breakers that several processes
// share, one state per key, and changes it atomically. It holds no rules:
// a [Breaker] loads the state, decides with its own rules, and writes the
// result back with CompareAndSwap, deciding again when another process
// changed the state in between.
//
// A store must be safe for concurrent use. Every method is called with a
// context that the Breaker bounds by its StoreTimeout; a method should
// return promptly, with an error, when the context is done. An error (or
// a timeout) never fails a call: the Breaker decides from its own state
// for that call and tries the store again on its next decision.
//
// On PostgreSQL a store is one row per key: the key, a version column and
// the state (JSON); CompareAndSwap is an UPDATE (or, at version 0, an
// INSERT … ON CONFLICT DO NOTHING) that matches on the version, and
// Watch is a LISTEN on a channel that CompareAndSwap NOTIFYs.
type BreakerStore interface {
	// Load returns the state stored for key and its version. A key never
	// written is not an error: Load returns the zero SharedState and
	// version 0.
	Load(ctx context.Context, key string) (state SharedState, version int64, err error)

	// CompareAndSwap stores next for key when the stored version is
	// still version (0: nothing stored yet), and then the stored
	// version becomes greater than version. It returns false, with a nil
	// error, when the stored version is another: someone changed the
	// state since it was loaded, and nothing was written.
	CompareAndSwap(ctx context.Context, key string, version int64, next SharedState) (ok bool, err error)

	// Watch returns a channel that receives a value soon after the state
	// of key changes (a change this process made may be sent too), until
	// ctx is done; then the store closes it. The channel may drop values
	// when the receiver is slow: a value means "load again", not which
	// change. A nil channel with a nil error means the store cannot
	// watch, and the Breaker polls instead.
	Watch(ctx context.Context, key string) (<-chan struct{}, error)
}

// SharedFormat is the [SharedState.Format] this version of the package
// writes. A Breaker that loads a state of a newer format does not use
// it, and decides from its own state as when the store fails: a fleet in
// the middle of an upgrade stays safe, if not shared.
const SharedFormat = 1

// SharedState is everything a fleet of processes must agree on about one
// backend: what a [Breaker] keeps, less the line of calls waiting in each
// process. It is a plain value, encoded as JSON by a store that needs
// bytes; its zero value is a closed breaker that has seen nothing.
//
// Times are wall-clock times of the processes that wrote them: a fleet
// sharing a store must keep its clocks in step (NTP keeps them within
// milliseconds, far less than any cooldown or pacing interval).
type SharedState struct {
	// Format is the layout of this value; SharedFormat when written by
	// this package, 0 when nothing was written.
	Format int `json:"format"`

	Failures int       `json:"failures,omitempty"` // consecutive retryable failures, across the fleet
	Until    time.Time `json:"until,omitzero"`     // open until then; zero when closed
	Kind     Kind      `json:"kind,omitempty"`     // the Kind of the failure that opened it
	Hinted   bool      `json:"hinted,omitempty"`   // a retry-after hint set Until
	Opened   int       `json:"opened,omitempty"`   // times it has opened, across the fleet

	// The half-open probe, as a lease: the process (ProbeOwner, a
	// Breaker's own random id) that sends it holds it until ProbeUntil.
	// A lease past ProbeUntil is free again, so a process that dies
	// while probing does not hold the backend half-open for good.
	ProbeOwner string    `json:"probe_owner,omitempty"`
	ProbeUntil time.Time `json:"probe_until,omitzero"`

	// Pacing: the freshest rate-limit report, and the requests let
	// through around and after its send (S is counted from Admits and
	// Dropped, by the rules on [Breaker]).
	Report    *SharedReport     `json:"report,omitempty"`     // nil until the first report
	ReportSeq uint64            `json:"report_seq,omitempty"` // the admission of the report's own request; 0 when not known
	Admits    []SharedAdmission `json:"admits,omitempty"`     // the admissions a report, present or to come, may count from, in order
	Dropped   int               `json:"dropped,omitempty"`    // admissions dropped from Admits that S still counts
	DroppedAt time.Time         `json:"dropped_at,omitzero"`  // when the last of them came back
	AdmitSeq  uint64            `json:"admit_seq,omitempty"`  // the last admission's number, across the fleet
	TokenUse  int64             `json:"token_use,omitempty"`  // tokens a request uses, as the reports' drop says; 0 until known

	// Line is the calls of every process waiting to send, the
	// earliest-begun first (on a tie, by Owner): the first-come line of
	// the half-open probe and of pacing is the fleet's. An entry past
	// its Until is dropped, so that a process that dies while its calls
	// wait does not hold the others up for good.
	Line []SharedWaiter `json:"line,omitempty"`
}

// SharedWaiter is a call waiting to send through a [Breaker] of the
// fleet.
type SharedWaiter struct {
	Start time.Time `json:"start"` // when its Do began: its place in the line
	Ready time.Time `json:"ready"` // when it comes to the breaker; until then it holds no one up
	Owner string    `json:"owner"` // its Breaker's id and its number there
	Until time.Time `json:"until"` // when its place runs out if its process never takes it out
}

// SharedAdmission is one request a [Breaker] of the fleet let through.
type SharedAdmission struct {
	At   time.Time `json:"at"`             // when it was let through, no later than its send
	Seq  uint64    `json:"seq"`            // its number, from SharedState.AdmitSeq
	Done bool      `json:"done,omitempty"` // its outcome was observed
	Back time.Time `json:"back,omitzero"`  // when, with Done; with !Done, when it is taken as back if its process never says (a lease)
}

// SharedReport is a rate-limit report as a [Breaker] keeps it: what one
// response's headers said about the provider's buckets.
type SharedReport struct {
	Sent         time.Time    `json:"sent"`                   // when the request that drew it was sent
	Read         time.Time    `json:"read"`                   // when its header was read; resets count from it
	Requests     SharedBucket `json:"requests,omitzero"`      // the requests bucket
	Tokens       SharedBucket `json:"tokens,omitzero"`        // the tokens bucket
	InputTokens  SharedBucket `json:"input_tokens,omitzero"`  // Anthropic's input-tokens bucket
	OutputTokens SharedBucket `json:"output_tokens,omitzero"` // Anthropic's output-tokens bucket
	RetryAt      time.Time    `json:"retry_at,omitzero"`      // when Retry-After said to try again; zero when it did not
}

// SharedBucket is what one report said about one of the provider's
// buckets. Known is false when the report said nothing of it.
type SharedBucket struct {
	Known     bool          `json:"known,omitempty"`
	Limit     int64         `json:"limit,omitempty"`     // the bucket's size; 0 when not stated
	Remaining int64         `json:"remaining,omitempty"` // what it held when the provider answered
	Reset     time.Duration `json:"reset,omitempty"`     // until it is full again, from Read
	Next      time.Time     `json:"next,omitzero"`       // when the provider admits the next unit beyond Remaining
}

// DefaultStoreTimeout bounds each call a [Breaker] with a Store makes to
// it when its StoreTimeout is zero.
const DefaultStoreTimeout = 50 * time.Millisecond

// DefaultProbeLease is how long a probe, any other request let through,
// or a waiting call's place in line, of a [Breaker] with a Store, holds
// when its process never says how it went (it died), when ProbeLease is
// zero: longer than a model's slowest answer, so that a probe still in
// flight is not taken for dead.
const DefaultProbeLease = 2 * time.Minute

// maxStoreTries bounds the loads and writes of one decision when other
// processes keep changing the state in between; past it the Breaker
// decides from its own state, as when the store fails.
const maxStoreTries = 8

// sharedPoll is how often the calls waiting on a Breaker with a Store
// look at the state again when the store cannot watch (or until its
// Watch answers).
const sharedPoll = 500 * time.Millisecond

// localTicket marks the admissions a Breaker let through while its store
// failed: the fleet did not number them, so their numbers must not match
// one of its own.
const localTicket = 1 << 63

// errStoreBusy is the store error of a decision whose every write found
// the state changed by another process.
var errStoreBusy = errors.New("llmretry: breaker store: the state changed on every try")

// decideShared runs decide, one of the Breaker's decisions, on the state
// its Store keeps: it loads the state, decides on it and writes the
// outcome back when nobody changed the state meanwhile, and otherwise
// decides again. When the store fails or is slower than StoreTimeout, it
// decides from the state the Breaker last held, and counts the failure;
// the next decision asks the store again. b.mu must not be held: the
// store is called without it, so that a slow store holds up no reading
// of the Breaker.
func decideShared[T any](b *Breaker, now time.Time, decide func() T) T {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(b.StoreTimeout, DefaultStoreTimeout))
	defer cancel()
	err := errStoreBusy
	for range maxStoreTries {
		// The wake-up of the verdict: a change that lands after the
		// load has read the state, and before decide hands out its
		// channel, would otherwise be lost, and a waiting call held by
		// the state as loaded would sleep through it (to its bound, when
		// no time ends its wait) while the backend has room.
		b.mu.Lock()
		seen := b.notifier()
		b.mu.Unlock()
		st, ver, lerr := b.Store.Load(ctx, b.Key)
		if lerr == nil && st.Format > SharedFormat {
			lerr = fmt.Errorf("llmretry: breaker store: state of format %d, newer than %d", st.Format, SharedFormat)
		}
		if lerr != nil {
			err = lerr
			break
		}
		b.mu.Lock()
		if ver < b.version {
			// Another call of this process loaded a newer state while
			// this load was on its way: this one is stale already.
			b.mu.Unlock()
			continue
		}
		b.load(st, ver, now)
		b.lineUnsure = false // b.line is the store's again
		before := b.save()
		// The calls of this process that left the line while the store
		// did not take their leave: out of it with this decision. Only
		// this process knows they are gone; left in, each would stand
		// ahead of every later call of the fleet for its whole lease.
		gone := slices.Clone(b.gone)
		b.line = slices.DeleteFunc(b.line, func(x SharedWaiter) bool { return slices.Contains(gone, x.Owner) })
		b.seen = seen
		v := decide()
		b.seen = nil
		next := b.save()
		b.mu.Unlock()
		if reflect.DeepEqual(before, next) {
			// Nothing to write: a call held back changes nothing, and a
			// write would wake every process's waiters for nothing.
			b.served(nil)
			b.forget(gone)
			return v
		}
		ok, cerr := b.Store.CompareAndSwap(ctx, b.Key, ver, next)
		if cerr != nil {
			// Decided on the fleet's state, but whether the write landed
			// is not known: the local state holds the decision. A call
			// it took out of the fleet's line may still stand there.
			b.served(cerr)
			b.mu.Lock()
			b.lineUnsure = true
			b.mu.Unlock()
			return v
		}
		if ok {
			b.served(nil)
			b.forget(gone)
			return v
		}
		// Someone else changed the state: undo this decision here, and
		// decide again on theirs.
		b.mu.Lock()
		b.load(before, b.version, now)
		b.mu.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail(err)
	b.load(b.save(), b.version, now) // frees the leases that ran out meanwhile
	b.local = true
	defer func() { b.local = false }()
	return decide()
}

// forget drops names from b.gone: the store's line no longer holds
// them.
func (b *Breaker) forget(names []string) {
	if len(names) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gone = slices.DeleteFunc(b.gone, func(n string) bool { return slices.Contains(names, n) })
}

// served records how a store call went: err nil for a success.
func (b *Breaker) served(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.fail(err)
		return
	}
	b.storeDown = false
}

// fail counts a failed store call; b.mu is held.
func (b *Breaker) fail(err error) {
	b.storeErrs++
	b.storeErr, b.storeDown = err, true
}

// lease is how long a request let through counts in flight in the store
// when its process never says how it went.
func (b *Breaker) lease() time.Duration { return cmp.Or(b.ProbeLease, DefaultProbeLease) }

// probeName is the ProbeOwner of the probe let through as admission
// ticket: unique to this Breaker, and to that probe of it.
func (b *Breaker) probeName(ticket uint64) string {
	if b.id == "" {
		b.id = strconv.FormatUint(rand.Uint64(), 36)
	}
	return b.id + "/" + strconv.FormatUint(ticket, 10)
}

// load makes st, read from the store at version ver, the Breaker's
// state at now, and frees the leases that have run out: a probe whose
// process said nothing in time is no longer in flight, and neither is
// any other request let through. b.mu is held.
func (b *Breaker) load(st SharedState, ver int64, now time.Time) {
	b.version = max(b.version, ver)
	b.fails, b.until, b.kind, b.hinted, b.opened = st.Failures, st.Until, st.Kind, st.Hinted, st.Opened
	b.probeOwner, b.probeUntil = st.ProbeOwner, st.ProbeUntil
	b.probing = st.ProbeOwner != "" && now.Before(st.ProbeUntil)
	if !b.probing {
		b.probeOwner, b.probeUntil = "", time.Time{}
	}
	b.hasReport = st.Report != nil
	b.report = limitReport{}
	if st.Report != nil {
		b.report = fromSharedReport(*st.Report)
	}
	b.reportSeq, b.dropped, b.droppedAt, b.admitSeq, b.tokenUse = st.ReportSeq, st.Dropped, st.DroppedAt, st.AdmitSeq, st.TokenUse
	b.line = b.line[:0]
	for _, x := range st.Line {
		if now.Before(x.Until) {
			b.line = append(b.line, x)
		}
	}
	b.admits = make([]admission, 0, len(st.Admits))
	b.inFlight = 0
	for _, a := range st.Admits {
		x := admission{at: a.At, seq: a.Seq, done: a.Done}
		switch {
		case a.Done:
			x.back = a.Back
		case !a.Back.IsZero() && !now.Before(a.Back):
			x.done, x.back = true, a.Back // its lease ran out: taken as back then
		default:
			x.lease = a.Back
			b.inFlight++
		}
		b.admits = append(b.admits, x)
	}
}

// save is the Breaker's state as the store keeps it. b.mu is held.
func (b *Breaker) save() SharedState {
	st := SharedState{
		Format:   SharedFormat,
		Failures: b.fails, Until: b.until, Kind: b.kind, Hinted: b.hinted, Opened: b.opened,
		ReportSeq: b.reportSeq, Dropped: b.dropped, DroppedAt: b.droppedAt, AdmitSeq: b.admitSeq, TokenUse: b.tokenUse,
	}
	if b.probing {
		st.ProbeOwner, st.ProbeUntil = b.probeOwner, b.probeUntil
	}
	if b.hasReport {
		r := toSharedReport(b.report)
		st.Report = &r
	}
	if len(b.line) > 0 {
		st.Line = slices.Clone(b.line)
	}
	if len(b.admits) > 0 {
		st.Admits = make([]SharedAdmission, len(b.admits))
		for i, a := range b.admits {
			st.Admits[i] = SharedAdmission{At: a.at, Seq: a.seq, Done: a.done, Back: a.back}
			if !a.done {
				st.Admits[i].Back = a.lease
			}
		}
	}
	return st
}

// toSharedReport is r as the store keeps it.
func toSharedReport(r limitReport) SharedReport {
	return SharedReport{
		Sent: r.sent, Read: r.read, RetryAt: r.retryAt,
		Requests: toSharedBucket(r.requests), Tokens: toSharedBucket(r.tokens),
		InputTokens: toSharedBucket(r.inputTokens), OutputTokens: toSharedBucket(r.outputTokens),
	}
}

// fromSharedReport is toSharedReport undone.
func fromSharedReport(r SharedReport) limitReport {
	return limitReport{
		sent: r.Sent, read: r.Read, retryAt: r.RetryAt,
		requests: fromSharedBucket(r.Requests), tokens: fromSharedBucket(r.Tokens),
		inputTokens: fromSharedBucket(r.InputTokens), outputTokens: fromSharedBucket(r.OutputTokens),
	}
}

func toSharedBucket(k bucketReading) SharedBucket {
	return SharedBucket{Known: k.known, Limit: k.limit, Remaining: k.remaining, Reset: k.reset, Next: k.next}
}

func fromSharedBucket(k SharedBucket) bucketReading {
	return bucketReading{known: k.Known, limit: k.Limit, remaining: k.Remaining, reset: k.Reset, next: k.Next}
}

// startWatch starts what wakes the calls waiting on b when another
// process changes its state: the store's Watch, and a poll every
// sharedPoll until Watch answers, or for good when it cannot watch. It
// returns the func that stops it. b.mu is held.
func (b *Breaker) startWatch() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	type watched struct {
		ch  <-chan struct{}
		err error
	}
	res := make(chan watched, 1)
	go func() {
		ch, err := b.Store.Watch(ctx, b.Key)
		res <- watched{ch, err}
	}()
	go func() {
		poll := time.NewTicker(sharedPoll)
		defer poll.Stop()
		var (
			changed <-chan struct{}
			tick    = poll.C
			started = res
		)
		for {
			select {
			case <-ctx.Done():
				return
			case w := <-started:
				started = nil
				if w.err != nil {
					b.mu.Lock()
					b.fail(w.err)
					b.mu.Unlock()
				}
				if w.ch != nil {
					changed, tick = w.ch, nil
				}
				// A change made after the waiting calls last loaded the
				// state and before the watch began went unheard: they
				// look again, once.
				b.mu.Lock()
				b.wake()
				b.mu.Unlock()
				continue
			case _, ok := <-changed:
				if !ok {
					changed, tick = nil, poll.C // the watch ended: poll
					continue
				}
			case <-tick:
			}
			b.mu.Lock()
			b.wake()
			b.mu.Unlock()
		}
	}()
	return cancel
}

// fleetLine reports whether the line that orders b's calls is the
// fleet's: with a Store, unless the store failed this decision.
func (b *Breaker) fleetLine() bool { return b.Store != nil && !b.local }

// waiterName is w's Owner in the fleet's line.
func (b *Breaker) waiterName(w *breakerWaiter) string {
	b.probeName(0) // names b
	return b.id + "/w" + strconv.FormatUint(w.seq, 10)
}

// enlist puts w in the fleet's line at now, unless it is there already;
// b.mu is held.
func (b *Breaker) enlist(w *breakerWaiter, now time.Time) {
	name := b.waiterName(w)
	if slices.ContainsFunc(b.line, func(x SharedWaiter) bool { return x.Owner == name }) {
		return
	}
	x := SharedWaiter{Start: w.start, Ready: w.ready, Owner: name, Until: now.Add(b.lease())}
	i, _ := slices.BinarySearchFunc(b.line, x, func(a, b SharedWaiter) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return cmp.Compare(a.Owner, b.Owner)
	})
	b.line = slices.Insert(b.line, i, x)
}

// delist takes w out of the fleet's line; b.mu is held.
func (b *Breaker) delist(w *breakerWaiter) {
	name := b.waiterName(w)
	b.line = slices.DeleteFunc(b.line, func(x SharedWaiter) bool { return x.Owner == name })
}

// inFleetLine reports whether w stands in the fleet's line, as b last
// saw it, or may stand there: a write that took it out failed, and no
// load since has said.
func (b *Breaker) inFleetLine(w *breakerWaiter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lineUnsure {
		return true
	}
	name := b.waiterName(w)
	return slices.ContainsFunc(b.line, func(x SharedWaiter) bool { return x.Owner == name })
}

// fleetAhead is ahead for the fleet's line: the calls before w that have
// come to the breaker at now, all of them when w is not in line.
func (b *Breaker) fleetAhead(now time.Time, w *breakerWaiter) int {
	name := ""
	if w != nil {
		name = b.waiterName(w)
	}
	k := 0
	for _, x := range b.line {
		if x.Owner == name {
			break
		}
		if !x.Ready.After(now) {
			k++
		}
	}
	return k
}

// fleetFirst reports whether w (nil: a call not in line) is the first
// call of the fleet's line that has come to the breaker at now.
func (b *Breaker) fleetFirst(now time.Time, w *breakerWaiter) bool {
	for _, x := range b.line {
		if !x.Ready.After(now) {
			return w != nil && x.Owner == b.waiterName(w)
		}
	}
	return w == nil
}
