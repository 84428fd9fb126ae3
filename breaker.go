package llmretry

import (
	"cmp"
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
// safe for concurrent use; copy it only before first use. Its cost per
// decision does not grow with the calls in flight or waiting: each
// waiting call is woken once, when its turn comes.
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
//   - A success of an attempt sent before the breaker opened closes it
//     too, open or half-open: the backend has just answered.
//   - The calls that wait for a breaker form one line, in the order their
//     Do began. Whenever the breaker lets calls of the line go (it closes,
//     or pacing makes room for several), they go in that order, one
//     millisecond apart: let go together, they would reach the backend at
//     one instant, and which of them a rate-limited backend answered
//     would depend on which goroutine ran first.
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
//     known), and no earlier than the response's Retry-After (held to
//     the backend's MaxWait, as an open period is).
//   - S is the requests the breaker let through after that request was
//     sent, and those let through before it that were still in flight
//     then: counting from the send, not from the report's arrival, counts
//     the requests that reached the provider while the report was on its
//     way back.
//   - A call is let through when R − S, plus 1 once T has come, is more
//     than the calls ahead of it in the breaker's line. Once the report
//     is older than the time the bucket takes to refill from empty (W,
//     from the reset and the limit), the limit less the requests let
//     through in the last W counts instead when it is more, so that an
//     old report does not hold the backend back for good.
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
//     what a request uses: its estimate ([Backend.Estimate]), charged
//     when it is let through and settled by the usage its answer
//     reports, or else the tokens the bucket lost between two reports
//     over the requests let through between them (a drop the refill can
//     only understate). What the bucket holds is what the report said
//     plus what it has refilled since the report was read, at the pace
//     its reset implies, never past its limit. A call is held back while
//     that, less the use of each of the S requests, is less than its own
//     use and that of each call ahead of it; once the bucket holds enough
//     for one more, that one goes in any case. Anthropic's input and output
//     buckets are counted the same way, by each request's estimate.
//     Until a use is known, tokens do not pace. (The requests bucket
//     counts no such refill: R − S, plus 1 once T has come.)
//
// Pacing does not replace the states above: a 429 with a retry-after
// hint still opens the breaker for the hint, and while it is open or
// half-open those rules decide alone. Set NoPacing to turn pacing off;
// [BreakerState] still shows the freshest report.
//
// A Breaker given a Store shares its state with the Breakers of every
// process that use the same store and Key, so that a fleet acts as one
// Breaker by the rules above: failures seen by any process open the
// backend for all, one probe goes through for the fleet, S counts the
// requests every process let through, and the line is the fleet's.
// [BreakerStore] says how the state is kept and what each decision costs
// in store calls. A store that fails, or is slower than StoreTimeout,
// fails no call: the Breaker decides from the state it last held, counts
// it in [BreakerState] StoreErrors, and shares what it decided meanwhile
// with its next write. Nor does a slow store keep a call past its
// deadline: a call that asks to send is then decided from the state last
// held, and an outcome, or a place in line given up, is written after
// the call has returned. With a Store, [Breaker.State]
// reads the state as this process last saw it, and Opened counts the
// fleet's openings.
//
// Failures, Cooldown, NoPacing, Store, Key, StoreTimeout and ProbeLease
// are read without the lock: set them before the breaker's first use and
// do not change them after.
type Breaker struct {
	Failures int           // consecutive failures of a retryable Kind, across calls, that open it; 0 means 5
	Cooldown time.Duration // how long it stays open before one probe may go through; 0 means 30s
	NoPacing bool          // do not pace by rate-limit reports; false means pace

	// Store, when set, keeps the state the fleet shares under Key, so
	// that Breakers of every process with the same Key act as one; nil
	// means this Breaker alone (see [BreakerStore]). A store may refuse
	// a key it cannot keep (see its docs): every store call then fails,
	// and the Breaker decides alone, counting StoreErrors.
	Store        BreakerStore
	Key          string        // the backend's name in Store, the same in every process, e.g. "openai/gpt-4o"
	StoreTimeout time.Duration // bounds the store calls of one decision; 0 means DefaultStoreTimeout
	ProbeLease   time.Duration // how long a probe, a request let through or a place in line holds in Store after its process last wrote (a process with requests out writes before it runs out); 0 means DefaultProbeLease

	mu      sync.Mutex
	health  health
	pacing  pacing
	line    line
	timer   *time.Timer // wakes the line at timerAt; nil until first needed
	timerAt time.Time   // zero while the timer is stopped
	fleet   *fleet      // with a Store: this process's view of the shared state; nil until first used
}

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
	h := &b.health
	st := BreakerState{Failures: h.fails, Opened: h.opened}
	if !h.until.IsZero() {
		st.Open, st.Until, st.Probing, st.Kind = true, h.until, h.probing, h.kind
	}
	if p := &b.pacing; p.has && p.report.requests.known {
		st.Reported, st.Remaining, st.NextAdmission, st.LetThrough = p.report.sent, p.report.requests.remaining, p.nextAdmission(), int(p.sentSince())
	}
	if f := b.fleet; f != nil {
		st.StoreErrors, st.StoreUnavailable, st.StoreErr = f.errs, f.down, f.err
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
	return b.health.until.After(t)
}

// callBounds is what of a Do bounds a Breaker's work for it: the
// backend's Policy MaxWait, which caps what an outcome asks the backend
// to wait (non-positive: no cap), and the call's deadline, which bounds
// the store calls made for it (zero: none).
type callBounds struct {
	maxWait  time.Duration
	deadline time.Time
}

// verdict is a breaker's answer to a call that wants to send.
type verdict struct {
	pass   bool      // send now, with ticket t
	t      ticket    // with pass: the admission, to hand back to observe
	turn   bool      // in line behind calls the breaker is letting go: wait for the turn, whatever bounds the call
	until  time.Time // when it half-opens, or when the provider admits the next request; zero when not known
	kind   Kind      // what opened it
	hinted bool      // a retry-after hint set its open period, or pacing holds the call: the provider said when
	paced  bool      // closed by pacing, not open: the call skips with Why paced
}

// onTurn is the verdict for a call in line behind calls the breaker is
// letting go, a handOff apart from the gate on: held by the line's pace,
// which is pacing, as its record says if its wait is cut. b.mu is held.
func (b *Breaker) onTurn() verdict {
	return verdict{turn: true, paced: true, kind: KindTransient, until: b.line.gate}
}

// rules applies the Breaker's rules to a call that wants to send at now
// with k calls ahead of it in line, its request estimated at c; it leaves
// the state as it is. b.mu is held.
func (b *Breaker) rules(now time.Time, k int, c cost) verdict {
	h := &b.health
	switch {
	case h.until.IsZero():
		if !b.NoPacing {
			if held, until := b.pacing.hold(now, int64(k), c); held {
				return verdict{paced: true, kind: KindTransient, hinted: true, until: until}
			}
		}
		return verdict{pass: true}
	case now.Before(h.until):
		return verdict{until: h.until, kind: h.kind, hinted: h.hinted}
	case h.probing || k > 0:
		// Half-open, and the probe is someone else's: the waiting call
		// that began first goes before anyone who just arrived.
		return verdict{kind: h.kind, hinted: h.hinted}
	}
	return verdict{pass: true, t: ticket{probe: true}}
}

// letThrough counts a request let through at now by verdict v, and
// returns v with its ticket. With a Store the request counts in this
// process's entry, and a probe holds a lease. b.mu is held.
func (b *Breaker) letThrough(now time.Time, v verdict, c cost) verdict {
	probe := v.t.probe
	v.t = b.pacing.admit(now, !b.NoPacing, c)
	v.t.probe = probe
	if probe {
		b.health.probing = true
	}
	if f := b.fleet; f != nil && b.Store != nil {
		// While the backend has never reported, its counts go with the
		// next write rather than one of their own: numbered here alone.
		v.t.local = f.local || !b.pacing.has
		e := b.ownEntry(now)
		e.InFlight++
		e.Est = e.Est.plus(c)
		if probe {
			f.probe, f.probeAt = b.probeName(v.t), now.Add(b.lease())
		}
	}
	return v
}

// admit answers a call that wants to send at now; w is its place in line,
// kept from the wait before a retry, or nil; deadline is the call's (zero:
// none), which bounds what it waits for a Store; c what its request is
// estimated to use; start when its Do began. A call let through takes
// its place out of line; one held back keeps it, for wait or leave.
func (b *Breaker) admit(now time.Time, w *waiter, deadline time.Time, c cost, start time.Time) verdict {
	if b.Store != nil {
		return b.fleetAdmit(now, w, deadline, c, start)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dispatch(now)
	if w != nil && w.granted {
		w.granted = false
		return verdict{pass: true, t: w.t}
	}
	v, take := b.answer(now, w, c)
	if take {
		b.remove(w)
	}
	return v
}

// answer decides for a call that asks to send at now, w its place in
// line (nil: none), once the line has had its turn: it counts the
// request when it is let through, and reports whether w then leaves the
// line. It does not change the line. b.mu is held.
func (b *Breaker) answer(now time.Time, w *waiter, c cost) (v verdict, take bool) {
	first := b.line.first()
	switch {
	case w == nil || w.gone:
		// Not in line: after every call in it.
		v = b.rules(now, b.allWaiting(), c)
	case first == w:
		v = b.rules(now, b.othersAhead(w.start), c)
		if v.pass && now.Before(b.line.gate) {
			return b.onTurn(), false
		}
	default:
		// Behind calls of the line: held back as the first is, and
		// otherwise by the calls ahead of it; when they leave it room, its
		// turn comes after theirs.
		others := b.othersAhead(w.start)
		if v = b.rules(now, others, c); !v.pass {
			return v, false
		}
		limit := int(min(max(b.pacing.room(now, c), 0), int64(b.line.waiting())))
		if b.NoPacing {
			limit = 0
		}
		if v = b.rules(now, others+b.line.queue.countBefore(w, limit), c); v.pass {
			return b.onTurn(), false
		}
	}
	if !v.pass {
		return v, false
	}
	return b.letThrough(now, v, c), w != nil && !w.gone
}

// wait puts the call in line as a waiting one, until end at most: w is
// the place admit answered for (nil: a new place for a call begun at
// start), and v what holds it back. The returned waiter's done channel is
// closed when the call is let through ([Breaker.claim]) or dismissed
// (its turn cannot come by end, or, for a call waiting only for its
// turn, the breaker stopped letting the line go).
func (b *Breaker) wait(now time.Time, w *waiter, start, end time.Time, v verdict, deadline time.Time, c cost) *waiter {
	if b.Store != nil {
		return b.fleetWait(now, w, start, end, v, deadline, c)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w = b.stand(now, w, start, end, v, c)
	b.dispatch(now)
	return w
}

// stand is wait's change to the line; b.mu is held.
func (b *Breaker) stand(now time.Time, w *waiter, start, end time.Time, v verdict, c cost) *waiter {
	if w == nil || w.gone {
		w = b.line.join(start, now, c)
		b.line.advance(now)
	}
	w.end, w.v, w.done, w.over = end, v, make(chan struct{}), false
	w.onTurn = v.turn
	if v.turn {
		b.line.turns++
	} else {
		b.line.ends.push(w)
	}
	return w
}

// claim takes the admission of a waiting call that was let through, and
// reports false when it was dismissed instead, with what held it back.
func (b *Breaker) claim(w *waiter) (verdict, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		w.granted = false
		return verdict{pass: true, t: w.t}, true
	}
	return w.v, false
}

// expire ends the wait of w at now, the end of its bound: it is let
// through if it was given its turn by now (without a Store, a turn that
// comes at this very instant counts), and otherwise leaves the line,
// with what held it back. deadline is the call's (zero: none).
func (b *Breaker) expire(now time.Time, w *waiter, deadline time.Time) (verdict, bool) {
	if b.Store != nil {
		return b.fleetExpire(now, w, deadline)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dispatch(now)
	if w.granted {
		w.granted = false
		return verdict{pass: true, t: w.t}, true
	}
	b.remove(w)
	b.dispatch(now)
	return w.v, false
}

// leave takes w out of line: its call gave up, or went elsewhere. An
// admission it was given and did not claim goes back, as a request that
// said nothing about the backend. A nil w is no call. deadline is the
// call's (zero: none).
func (b *Breaker) leave(w *waiter, deadline time.Time) {
	if w == nil {
		return
	}
	if b.Store != nil {
		b.fleetLeave(w, deadline)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if w.granted {
		w.granted = false
		b.settle(now, w.t, &outcome{kind: KindCancelled})
	}
	b.remove(w)
	b.dispatch(now)
}

// remove takes w out of line; b.mu is held.
func (b *Breaker) remove(w *waiter) {
	if w.gone {
		return
	}
	if w.onTurn {
		b.line.turns--
		w.onTurn = false
	}
	b.line.take(w)
}

// join puts a call begun at start in the line, to come to the breaker at
// ready, the end of the wait before its retry: a call coming back after
// a retry-after goes before those that began later.
func (b *Breaker) join(start, ready time.Time, c cost) *waiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.line.join(start, ready, c)
}

// observe records how an attempt the breaker let through with ticket t
// went, o, at now; cb is what of the call bounds it.
func (b *Breaker) observe(now time.Time, t ticket, o *outcome, cb callBounds) {
	o.capWaits(now, cb.maxWait)
	if b.Store != nil {
		b.fleetObserve(now, t, o, cb.deadline)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settle(now, t, o)
	b.dispatch(now)
}

// settle learns outcome o of ticket t at now; b.mu is held. A probe's
// outcome is its own only while it holds the probe: with a Store, once
// its lease ran out another may probe, and this late outcome must not end
// that one's.
func (b *Breaker) settle(now time.Time, t ticket, o *outcome) {
	b.pacing.settle(now, t, o.rep, o.hasRep, o.used)
	probe := t.probe
	if f := b.fleet; f != nil && b.Store != nil {
		probe = probe && f.probe == b.probeName(t)
		if probe {
			f.probe, f.probeAt = "", time.Time{}
		}
	}
	if b.health.observe(now, probe, o, cmp.Or(b.Failures, DefaultBreakerFailures), cmp.Or(b.Cooldown, DefaultCooldown)) {
		b.line.gate = now // a closing breaker lets its line go from now
	}
}

// lineTurn is what the line's turn decided: the call let through, with its
// ticket, or the calls dismissed, with what holds the line. It is carried
// out once the decision stands: at once, or with a Store once the store
// took it.
type lineTurn struct {
	let  *waiter
	t    ticket
	over []*waiter
	why  verdict
}

// turn decides the line's turn at now: the first call goes when the rules
// let it (with the fleet's calls ahead of it, with a Store), no sooner
// than the gate, a handOff after the last one let go; otherwise the
// calls that cannot be let through in time are dismissed. It counts the
// request let through, but does not change the line. b.mu is held.
func (b *Breaker) turn(now time.Time) lineTurn {
	b.line.advance(now)
	w := b.line.first()
	if w == nil || now.Before(b.line.gate) {
		return lineTurn{}
	}
	v := b.rules(now, b.othersAhead(w.start), w.cost)
	if !v.pass {
		return lineTurn{over: b.dismissals(v), why: v}
	}
	v = b.letThrough(now, v, w.cost)
	if b.line.waiting() > 1 || b.othersAhead(maxTime) > 0 {
		// The next in line goes no sooner than a handOff later.
		b.line.gate = now.Add(handOff)
	}
	return lineTurn{let: w, t: v.t}
}

// carryOut carries out turn p; b.mu is held.
func (b *Breaker) carryOut(p lineTurn) {
	if w := p.let; w != nil && !w.gone {
		b.remove(w)
		w.granted, w.t = true, p.t
		if w.done != nil {
			close(w.done)
		}
	}
	for _, w := range p.over {
		if !w.gone {
			w.v = p.why
			b.over(w)
		}
	}
}

// dispatch gives the line its turn at now, carries it out, ends the
// waits whose bound has come, and sets the timer for the next time that
// can change anything. b.mu is held.
func (b *Breaker) dispatch(now time.Time) {
	b.carryOut(b.turn(now))
	b.endWaits(now)
	b.schedule(now)
}

// endWaits dismisses the waiting calls whose bound has come by now, once
// the line has had its turn at now: the Breaker keeps their bounds, so
// that a waiting call needs no timer of its own. b.mu is held.
func (b *Breaker) endWaits(now time.Time) {
	for w := b.line.ends.min(); w != nil && !w.end.After(now); w = b.line.ends.min() {
		b.over(w)
	}
}

// dismissals are the calls that cannot be let through in time, v being
// what holds the first: those whose bound ends before v's until, and
// those waiting only for their turn, which must decide again now that the
// breaker holds the line. b.mu is held.
func (b *Breaker) dismissals(v verdict) []*waiter {
	var out []*waiter
	if !v.until.IsZero() {
		out = b.line.ends.before(func(w *waiter) bool { return v.until.After(w.end) })
	}
	if b.line.turns > 0 {
		// Rare: calls came back to a line the breaker was letting go,
		// and it stopped. Each is found once.
		for _, w := range b.line.queue.ws {
			if w.onTurn {
				out = append(out, w)
			}
		}
	}
	return out
}

// over takes w out of line, dismissed; b.mu is held.
func (b *Breaker) over(w *waiter) {
	b.remove(w)
	w.over = true
	if w.done != nil {
		close(w.done)
	}
}

// schedule sets the timer for the next time the first call's lot can
// change with nothing else happening; b.mu is held.
func (b *Breaker) schedule(now time.Time) {
	if b.Store != nil {
		b.scheduleFleet(now)
		return
	}
	var next time.Time
	if w := b.line.ends.min(); w != nil {
		next = w.end
	}
	if first := b.line.first(); first != nil {
		h := &b.health
		switch {
		case now.Before(b.line.gate):
			next = earliest(next, b.line.gate)
		case now.Before(h.until):
			next = earliest(next, h.until)
		case !h.until.IsZero():
			// Half-open with a probe in flight: its outcome wakes the line.
		case !b.NoPacing:
			next = earliest(next, b.pacing.nextChange(now, first.cost))
		}
	}
	b.setTimer(now, next)
}

// earliest is the earlier of two times, the zero time standing for none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// setTimer makes the timer fire at next, or stops it when next is zero;
// b.mu is held.
func (b *Breaker) setTimer(now, next time.Time) {
	if next.Equal(b.timerAt) {
		return
	}
	earlier := !b.timerAt.IsZero() && next.Before(b.timerAt)
	b.timerAt = next
	if next.IsZero() {
		if b.timer != nil {
			b.timer.Stop()
		}
		return
	}
	if b.timer == nil || earlier {
		// A timer moved earlier makes the runtime look through every
		// timer of its P the next time it checks them (the calls' own
		// timers among them), so a new one is made instead: the old,
		// stopped, is dropped in bulk.
		if b.timer != nil {
			b.timer.Stop()
		}
		b.timer = time.AfterFunc(next.Sub(now), b.tick)
		return
	}
	b.timer.Reset(next.Sub(now))
}

// tick is the timer's: the line's turn at the time it was set for.
func (b *Breaker) tick() {
	if b.Store != nil {
		b.fleetTick()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.timerAt = time.Time{}
	b.dispatch(time.Now())
}
