package llmretry

import (
	"cmp"
	"math"
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
// A Breaker also paces its backend by the rate-limit reports its calls
// make ([ReportLimits], [StatusFailure]), so as to send nothing the
// provider would refuse. Until the first report it does not pace, and a
// backend that reports nothing is never paced. The rules:
//
//   - The freshest report wins: the one whose request was sent last
//     (reports arrive out of order: a 429 after 0.2 s is fresher than a
//     200 sent two seconds earlier); on a tie, the one with fewer
//     requests remaining. From it, R is the requests remaining, and T
//     when the provider admits the next request: the reset divided by
//     the requests missing from the limit, as a bucket that is full
//     again at the reset refills (the full reset when the limit is not
//     known), and no earlier than the response's Retry-After (for no
//     longer than the backend's MaxWait, as for an open period).
//   - S is the requests the breaker let through after that request was
//     sent, and those let through before it that were still in flight
//     then (which reached the provider first is not known): counting from
//     the send, not from the report's arrival, counts the requests that
//     reached the provider while the report was on its way back.
//   - A call is let through when R − S, plus 1 once T has come, is more
//     than the calls ahead of it in the breaker's line (the first-come
//     line of the half-open probe). Once the report is older than the
//     time the bucket takes to refill from empty (W, from the reset and
//     the limit), the limit less the requests let through in the last W
//     counts instead when it is more, so that an old report does not
//     hold the backend back for good.
//   - Otherwise the backend is closed to the call, and no failure is
//     counted: the call skips it (Skipped, Why [WhyPaced], Kind
//     [KindTransient], RetryAfter the time until T), or, when it is the
//     last backend the call can try, waits in line until T or the next
//     report. Such a wait is bounded as one for a breaker that a
//     retry-after hint opened (see [Backend.Breaker]): the provider has
//     said when it admits the next request.
//   - When nothing the breaker let through is still in flight and the
//     next admission of every bucket that holds the call back has come,
//     it lets the first call in line through, so that a fresh report
//     comes back even after answers that carried none.
//   - The tokens bucket paces by the same rules, its requests counted in
//     what a request uses: the tokens the bucket lost between two
//     reports over the requests let through between them (a drop the
//     refill can only understate). A call is held back while what the
//     bucket holds, less that use for each of the S requests, is less
//     than that use for it and each call ahead of it, until the bucket
//     has refilled enough, at the pace its reset implies. Until a use is
//     known, tokens do not pace.
//
// Pacing does not replace the states above: a 429 with a retry-after
// hint still opens the breaker for the hint, and while it is open or
// half-open those rules decide alone. Set NoPacing to turn pacing off;
// [BreakerState] still shows the freshest report.
//
// A Breaker given a Store shares its state with the Breakers of every
// process that use the same store and Key, so that a fleet acts as one
// Breaker by the rules above: five failures seen by any processes open
// the backend for all, one probe goes through for the fleet, and S
// counts the requests every process let through. The rules stay here;
// the store keeps the state ([SharedState]) and changes it atomically:
//
//   - Each decision (to let a call through, to learn how it went) loads
//     the state, decides on it, and writes it back by compare-and-swap,
//     deciding again when another process wrote first. A decision that
//     changes nothing writes nothing. So a request through a closed
//     breaker costs four store calls; one that waits also loads the
//     state each time another process changes it.
//   - The line of waiting calls is the fleet's: each call waiting in any
//     process stands in it, by when its Do began.
//   - The half-open probe, each request let through, and each place in
//     the line are leases of ProbeLease: a process that dies while it
//     probes, sends or waits holds the others up no longer than that.
//   - Waiting calls wake when the store says another process changed the
//     state ([BreakerStore] Watch), or, when it cannot say, on a poll
//     every half second.
//   - A store that fails, or takes longer than StoreTimeout for one
//     decision, fails no call: the Breaker decides from the state it last
//     held, counts it in [BreakerState] StoreErrors and shows
//     StoreUnavailable until a store call succeeds again; every decision
//     asks the store afresh. What was decided locally meanwhile is not
//     shared: once the store answers, its state wins.
//
// With a Store, [Breaker.State] reads the state as this process last
// loaded it, and Opened counts the fleet's openings.
//
// Failures, Cooldown and NoPacing are read without the lock (as are Store, Key, StoreTimeout and ProbeLease): set them
// before the breaker's first use and do not change them after.
type Breaker struct {
	Failures int           // consecutive failures of a retryable Kind, across calls, that open it; 0 means 5
	Cooldown time.Duration // how long it stays open before one probe may go through; 0 means 30s
	NoPacing bool          // do not pace by rate-limit reports; false means pace

	// Store, when set, keeps the state the fleet shares under Key, so
	// that Breakers of every process with the same Key act as one; nil
	// means this Breaker alone (see [BreakerStore]).
	Store        BreakerStore
	Key          string        // the backend's name in Store, the same in every process, e.g. "openai/gpt-4o"
	StoreTimeout time.Duration // bounds the store calls of one decision; 0 means DefaultStoreTimeout
	ProbeLease   time.Duration // how long a probe, a request let through or a place in line holds in Store when its process never says; 0 means DefaultProbeLease

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

	// Pacing: the freshest rate-limit report, and the requests let
	// through around and after its send.
	report    limitReport
	hasReport bool
	reportSeq uint64      // the admission of the report's own request, which S leaves out; 0 when not known
	admits    []admission // the admissions a report, present or to come, may count from, in order
	dropped   int         // admissions dropped from admits that S still counts
	droppedAt time.Time   // when the last of them came back; zero while one was in flight when dropped
	inFlight  int         // admitted requests whose outcome has not been observed
	admitSeq  uint64      // numbers the admissions
	tokenUse  int64       // tokens a request uses, as the reports' drop says; 0 until known

	// With a Store (store.go): the probe's lease, and how the store
	// serves this Breaker.
	probeOwner string    // who holds the probe: this Breaker's id and the probe's admission
	probeUntil time.Time // when the probe's lease runs out; zero without a Store: it never does
	id         string    // this Breaker's name in ProbeOwner, random; empty until first needed
	version    int64     // the newest store version this Breaker has loaded
	local      bool      // deciding from local state, the store having failed: tickets are marked local
	storeErrs  int64
	storeErr   error
	storeDown  bool
	watchStop  func()         // stops the goroutine that wakes the waiters on a change in Store; nil when none runs
	line       []SharedWaiter // with a Store, the fleet's line as last loaded
	seen       chan struct{}  // while deciding on a loaded state: the change channel as of the load (see notifier)
	lineUnsure bool           // a write failed since the last load: line may lack calls that still stand in the store's
	gone       []string       // the fleet-line names of calls that left, until a decision has taken them out of the store's line
}

// admission is a request the breaker let through.
type admission struct {
	at   time.Time // when it was let through, no later than its send
	seq  uint64
	done bool      // its outcome was observed
	back time.Time // when, with done

	lease time.Time // with a Store, while not done: when it is taken as back if its process never says; zero: never
}

// maxAdmits bounds the admissions a breaker keeps. They pile up only
// when a backend that once reported stops doing so; the count beyond
// the bound is kept as a number, which can only overstate S.
const maxAdmits = 4096

// BreakerState is a reading of a [Breaker], for dashboards.
type BreakerState struct {
	Open     bool      // calls skip the backend, or wait for it when it is their last
	Until    time.Time // when it half-opens; zero when closed
	Failures int       // consecutive retryable failures counted so far
	Probing  bool      // a half-open probe is in flight
	Kind     Kind      // the Kind of the failure that opened it; KindUnknown when closed
	Opened   int       // times it went from closed or half-open to open since it was made: a counter for alerts

	// The freshest rate-limit report, as pacing reads it ([Breaker]
	// has the rules); all zero until a report of the requests bucket
	// came.
	Reported      time.Time // when the report's request was sent
	Remaining     int64     // the requests it said remained (R)
	NextAdmission time.Time // when the provider admits the next request (T)
	LetThrough    int       // the requests let through since the report's request was sent, and those in flight then (S)

	// With a Store: how it has served this Breaker.
	StoreErrors      int64 // store calls that failed or timed out, each a decision taken from local state
	StoreUnavailable bool  // the last store call failed: the fleet's state is not shared now
	StoreErr         error // the last store error; nil when none has failed
}

// State reads the breaker's state. A breaker past its open period is
// still Open until a probe answers, with Until in the past.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := BreakerState{Failures: b.fails, Opened: b.opened, StoreErrors: b.storeErrs, StoreUnavailable: b.storeDown, StoreErr: b.storeErr}
	if !b.until.IsZero() {
		st.Open, st.Until, st.Probing, st.Kind = true, b.until, b.probing, b.kind
	}
	if b.hasReport && b.report.requests.known {
		st.Reported, st.Remaining, st.NextAdmission, st.LetThrough = b.report.sent, b.report.requests.remaining, b.nextAdmission(), b.sentSince()
	}
	return st
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
	paced   bool            // closed by pacing, not open: the call skips with Why paced
	ticket  uint64          // with pass: the admission, to hand back to observe
}

// admit answers a call that wants to send at now; w is the call's place
// among the waiters, nil when it is not waiting.
func (b *Breaker) admit(now time.Time, w *breakerWaiter) verdict {
	if b.Store != nil {
		return decideShared(b, now, func() verdict { return b.decideAdmit(now, w) })
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.decideAdmit(now, w)
}

// decideAdmit is admit's decision, on the state b holds; b.mu is held.
// With a Store, a waiting call stands in the fleet's line until it is let
// through.
func (b *Breaker) decideAdmit(now time.Time, w *breakerWaiter) verdict {
	fleet := b.fleetLine() && w != nil
	if fleet {
		b.enlist(w, now)
	}
	v := b.decideTurn(now, w)
	if fleet && v.pass {
		b.delist(w)
	}
	return v
}

// isFirst reports whether w, nil for a call not in line, is the first in
// line at now: the local line's, or with a Store the fleet's.
func (b *Breaker) isFirst(now time.Time, w *breakerWaiter) bool {
	if b.fleetLine() {
		return b.fleetFirst(now, w)
	}
	return b.first(now) == w
}

// decideTurn is decideAdmit's rules; b.mu is held.
func (b *Breaker) decideTurn(now time.Time, w *breakerWaiter) verdict {
	switch {
	case b.until.IsZero() && w != nil && w.turn.After(now):
		return verdict{held: true, until: w.turn, changed: b.notifier()}
	case b.until.IsZero():
		if v, ok := b.pace(now, w); !ok {
			return v
		}
		return b.pass(now, false)
	case now.Before(b.until):
		return verdict{until: b.until, kind: b.kind, hinted: b.hinted, changed: b.notifier()}
	case b.probing || !b.isFirst(now, w):
		// Half-open, but the probe is someone else's: the waiting call
		// that began first goes before anyone who just arrived.
		return verdict{kind: b.kind, hinted: b.hinted, changed: b.notifier()}
	}
	b.probing = true
	v := b.pass(now, true)
	if b.Store != nil {
		b.probeOwner, b.probeUntil = b.probeName(v.ticket), now.Add(b.lease())
	}
	return v
}

// pass lets a request through at now, and counts it.
func (b *Breaker) pass(now time.Time, probe bool) verdict {
	b.admitSeq++
	a := admission{at: now, seq: b.admitSeq}
	if b.local {
		// Let through while the store failed: a number the fleet did not
		// give, marked so that it never settles another's admission.
		a.seq |= localTicket
	}
	if b.Store != nil {
		a.lease = now.Add(b.lease())
	}
	b.admits = append(b.admits, a)
	b.inFlight++
	return verdict{pass: true, probe: probe, ticket: a.seq}
}

// pace applies the pacing rules to a call that wants to send at now
// through the closed breaker; w is its place in the line, nil when it is
// not in it. It reports true when the call may go, and otherwise the
// verdict that holds it back.
func (b *Breaker) pace(now time.Time, w *breakerWaiter) (verdict, bool) {
	if b.NoPacing || !b.hasReport {
		return verdict{}, true
	}
	k := int64(b.ahead(now, w))
	s := int64(b.sentSince())
	var (
		held  bool      // a bucket holds too little for this call
		come  = true    // the next admission of every bucket that holds the call back has come
		until time.Time // the latest next admission of the buckets that hold the call back
	)
	// Each bucket says how many more requests it takes (n, one more once
	// t has come) and when it takes the next one beyond them (t).
	check := func(n int64, t time.Time) {
		if n <= k {
			held = true
			if now.Before(t) {
				come = false
				until = later(until, t)
			}
		}
	}
	if r := b.report.requests; r.known {
		t := b.nextAdmission()
		n := r.remaining - s
		if !now.Before(t) {
			n++
		}
		if m, ok := b.windowRoom(now); ok {
			n = max(n, m)
		}
		check(n, t)
	}
	if tk := b.report.tokens; tk.known && b.tokenUse > 0 {
		n, t := tokensFor(tk, b.report.read, s, b.tokenUse)
		if !now.Before(t) {
			n++
		}
		check(n, t)
	}
	if !held || (come && k == 0 && b.inFlight == 0) {
		return verdict{}, true
	}
	return verdict{paced: true, kind: KindTransient, hinted: true, until: until, changed: b.notifier()}, false
}

// tokensFor is what a tokens bucket, read at read as tk, takes once s
// more requests of use tokens each have been sent: how many more
// requests, and when it holds enough for the next one beyond them, as it
// refills steadily to full at its reset (as T is read for the requests
// bucket, for use tokens instead of one). Without a limit it is full again only
// at the reset.
func tokensFor(tk bucketReading, read time.Time, s, use int64) (int64, time.Time) {
	left := tk.remaining - s*use
	n := left / use
	if left < 0 {
		n = (left - use + 1) / use // rounded down, as for a positive left
	}
	need := (n+1)*use - left // tokens missing for the next request
	missing := tk.limit - tk.remaining
	if tk.limit <= 0 || missing <= 0 || need >= missing {
		return n, read.Add(tk.reset)
	}
	// Rounded up, never early; a float, as reset × need can overflow.
	return n, read.Add(time.Duration(math.Ceil(float64(tk.reset) * float64(need) / float64(missing))))
}

// windowRoom is a second reading of how many more requests the requests
// bucket takes at now, for a report that has grown old: a bucket of limit
// L that refills from empty in W has, whatever it held before, at least
// L less the requests taken in the last W. It reports false when the
// bucket's pace is not known, or when that window reaches back before
// the report's request was sent (the requests before it are not all
// counted). Without it a report would hold the backend to one request at
// a time for good once S passed R, even a report long stale, such as a
// 429's from a Call that reports only its failures.
func (b *Breaker) windowRoom(now time.Time) (int64, bool) {
	r := b.report.requests
	missing := r.limit - r.remaining
	if r.limit <= 0 || r.reset <= 0 || missing <= 0 {
		return 0, false
	}
	// The reset is the time to refill the missing requests; from empty,
	// the whole limit. Rounded up, and a float, as reset × limit can
	// overflow.
	w := math.Ceil(float64(r.reset) * float64(r.limit) / float64(missing))
	if w > float64(maxOpen) {
		return 0, false
	}
	start := now.Add(-time.Duration(w))
	if start.Before(b.report.sent) {
		return 0, false
	}
	n := int64(0)
	if !b.droppedAt.IsZero() && b.droppedAt.After(start) {
		n += int64(b.dropped) // folded into a count: some may be in the window
	}
	for _, a := range b.admits {
		if a.at.After(start) {
			n++
		}
	}
	return r.limit - n, true
}

// nextAdmission is T: when the freshest report says the provider admits
// the next request. A report without a reset or Retry-After does not
// say; T is then taken as come when the report was read, so that one
// request beyond R may go and bring a report that does say.
func (b *Breaker) nextAdmission() time.Time {
	if t := b.report.requests.next; !t.IsZero() {
		return t
	}
	return b.report.read
}

// sentSince is S: the requests let through since the freshest report's
// request was sent, that request itself left out. Any other still in
// flight at that send counts too, even one let through before it: which
// of them reached the provider first is not known (a goroutine can be
// slow to send what it was let through for), and counting it is the safe
// side. Only a request whose answer came back before the send surely
// reached the provider before it.
func (b *Breaker) sentSince() int {
	n := b.dropped
	for _, a := range b.admits {
		if b.counts(a) {
			n++
		}
	}
	return n
}

// counts reports whether S counts admission a.
func (b *Breaker) counts(a admission) bool {
	return a.seq != b.reportSeq && !(a.done && a.back.Before(b.report.sent))
}

// ahead is the number of calls in line before w that have come to the
// breaker at now: all of those in line when w is not in it.
func (b *Breaker) ahead(now time.Time, w *breakerWaiter) int {
	if b.fleetLine() {
		return b.fleetAhead(now, w)
	}
	k := 0
	for _, x := range b.waiters {
		if x == w {
			break
		}
		if !x.ready.After(now) {
			k++
		}
	}
	return k
}

// settle records that the request of admission ticket came back at now,
// with rep its rate-limit report, if it made one (hasRep).
func (b *Breaker) settle(now time.Time, ticket uint64, rep limitReport, hasRep bool) {
	for i := range b.admits {
		if a := &b.admits[i]; a.seq == ticket && !a.done {
			a.done, a.back = true, now
			b.inFlight--
			break
		}
	}
	if hasRep && (!b.hasReport || fresher(rep, b.report)) {
		if b.hasReport {
			b.learnTokenUse(rep, ticket)
		}
		b.report, b.hasReport, b.reportSeq = rep, true, ticket
		if !b.droppedAt.IsZero() && b.droppedAt.Before(rep.sent) {
			b.dropped = 0 // every dropped admission came back before this send
		}
	}
	b.prune()
}

// learnTokenUse reads, from the tokens the provider's bucket lost
// between the freshest report and rep, its successor (the report of
// admission ticket), what a request of this backend uses: the drop over
// the requests let through between the two. The bucket refills
// meanwhile, so the drop can only understate the use; a drop that is
// not positive says nothing, and the last use learned stays.
func (b *Breaker) learnTokenUse(rep limitReport, ticket uint64) {
	old := b.report.tokens
	if !old.known || !rep.tokens.known {
		return
	}
	n := int64(0)
	for _, a := range b.admits {
		if a.seq > b.reportSeq && a.seq <= ticket {
			n++
		}
	}
	if drop := old.remaining - rep.tokens.remaining; n > 0 && drop > 0 {
		b.tokenUse = (drop + n - 1) / n
	}
}

// prune forgets the admissions no report can count: those that came
// back before the freshest report's send, and before every request still
// in flight was let through (a report to come is one of theirs, sent
// after that).
func (b *Breaker) prune() {
	inFlightSince := time.Time{} // when the earliest request still in flight was let through; zero when none is
	for _, a := range b.admits {
		if !a.done {
			inFlightSince = a.at
			break
		}
	}
	b.admits = slices.DeleteFunc(b.admits, func(a admission) bool {
		return a.done && (inFlightSince.IsZero() || a.back.Before(inFlightSince)) && !(b.hasReport && b.counts(a))
	})
	if len(b.admits) > maxAdmits {
		// Fold the older half of those that came back into a count; a
		// request still in flight stays, to be settled (there are no
		// more of them than calls in flight).
		half := len(b.admits) / 2
		kept := make([]admission, 0, len(b.admits)-half)
		for i, a := range b.admits {
			if i < half && a.done {
				b.dropped++
				b.droppedAt = later(b.droppedAt, a.back)
				continue
			}
			kept = append(kept, a)
		}
		b.admits = kept
	}
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
	if b.Store != nil && b.watchStop == nil {
		b.watchStop = b.startWatch()
	}
	return w
}

// leave takes a call out of the waiters, and lets the next one try.
func (b *Breaker) leave(w *breakerWaiter) {
	if w == nil {
		return
	}
	if b.Store != nil && b.inFleetLine(w) {
		// It gave up waiting: out of the fleet's line too, or it holds
		// the others up until its place there runs out. Should this
		// decision not reach the store, the next one that does takes
		// it out (see gone).
		b.mu.Lock()
		b.gone = append(b.gone, b.waiterName(w))
		b.mu.Unlock()
		decideShared(b, time.Now(), func() struct{} { return struct{}{} })
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.waiters, w); i >= 0 {
		b.waiters = slices.Delete(b.waiters, i, i+1)
		b.wake()
	}
	if len(b.waiters) == 0 && b.watchStop != nil {
		b.watchStop()
		b.watchStop = nil
	}
}

// observe records how an attempt that the breaker admitted went: ok for a
// success, else its Kind and retry-after hint (KindCancelled when nothing
// was learned about the backend). probe says whether it was the half-open
// probe; maxWait caps how long a hint may hold it open (a non-positive
// maxWait, none). ticket is the admission the verdict gave, and rep the
// attempt's rate-limit report, if it made one (hasRep).
func (b *Breaker) observe(now time.Time, ok bool, kind Kind, hint time.Duration, probe bool, maxWait time.Duration, ticket uint64, rep limitReport, hasRep bool) {
	decide := func() struct{} {
		b.decideObserve(now, ok, kind, hint, probe, maxWait, ticket, rep, hasRep)
		return struct{}{}
	}
	if b.Store != nil {
		decideShared(b, now, decide)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	decide()
}

// decideObserve is observe's decision, on the state b holds; b.mu is
// held.
func (b *Breaker) decideObserve(now time.Time, ok bool, kind Kind, hint time.Duration, probe bool, maxWait time.Duration, ticket uint64, rep limitReport, hasRep bool) {
	if mw := maxWait; hasRep && mw > 0 && !rep.retryAt.IsZero() && rep.requests.next.After(now.Add(mw)) && !rep.retryAt.Before(rep.requests.next) {
		// A retry-after past MaxWait is a broken server's, as for the
		// open period: it must not hold the backend back longer.
		rep.requests.next = now.Add(mw)
	}
	b.settle(now, ticket, rep, hasRep)
	if probe && (b.Store == nil || b.probeOwner == b.probeName(ticket)) {
		// With a Store, the probe is this one's only while its lease
		// holds: once it ran out another may probe, and this late
		// outcome must not end that one's.
		b.probing, b.probeOwner, b.probeUntil = false, "", time.Time{}
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
// While b decides on a state loaded from its Store, that is the channel
// of when the load began, closed already if the state changed since: a
// verdict on a state that is stale by then must not wait for a change
// that has come.
func (b *Breaker) notifier() chan struct{} {
	if b.seen != nil {
		return b.seen
	}
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
