package llmretry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// How a Breaker with a Store shares its state: its health and pacing,
// as this process last read or wrote them, are its view of the shared
// state; the other processes appear in it by their entries (procEntry).
// Every decision of this process on the key goes through one sync at a
// time, which takes every decision due by then together (group commit):
// it brings the view up to the store's newest notice when the notices
// carry the state (freshen), loads the state only when another process
// may have changed it since and no notice says how (stale), decides on
// it, and writes it back by compare-and-swap when anything changed,
// deciding again on a conflict. What the store did not
// take is kept (carry) and made again with the next write: a decision
// made on the view while the store failed, and one whose write's fate is
// not known, unless the state then shows that write landed (the
// process's write count, Wseq, in its entry). A request such a write let
// through is counted by this process alone, as one let through while the
// store failed: the fleet may never have numbered it. While the store
// fails, each decision is made on the view, at once. A sync is bounded by
// StoreTimeout, not by its callers' deadlines: a caller whose deadline
// comes stops waiting, and the sync goes on to write what it decided.
//
// Waiting calls are woken in their turn: the process's timer is set to
// the next time its first call's lot can change, as the view says (a
// cooldown's end, the provider's next admission, the gate, a lease, a
// bound). A first call held back by pacing until an answer comes wakes at
// the provider's pace; one with other processes' lines ahead of it, a
// pace for each of them; only while another process's probe is in flight
// does a line load the state whenever it changes, since the probe's
// outcome is the one change that lets every line go.

// fleet is a Breaker's part in the fleet; b.mu guards it.
type fleet struct {
	id        string      // this process's name in the state: random
	version   int64       // the store's version of the view; 0 while nothing was read
	procs     []procEntry // the fleet's processes as last seen, this one's included
	dirty     bool        // the view is not to be trusted until read again: a write failed, or went unheard
	behind    bool        // another process wrote a version the view does not hold: a compare-and-swap found it
	writing   bool        // a compare-and-swap of the view is on its way
	changes   uint64      // the changes heard so far
	base      uint64      // changes when the view was last known to be the state
	mine      uint64      // of the changes heard since base, how many are this process's own writes
	wseq      uint64      // this process's writes so far
	carry     []change    // what this process decided that the store has not taken
	inView    bool        // the view holds carry already: it was decided on it and not read again since
	unwritten bool        // the view holds decisions the store may not have: a write failed, or the store did
	local     bool        // deciding without the store: what is let through is this process's alone
	pending   []*request  // decisions waiting for the next sync
	syncing   bool        // a sync is running
	listen    bool        // a change by another process wakes the line: load and dispatch
	watch     func()      // stops the watch; nil while none runs
	probe     string      // the probe this process holds, by its owner name
	probeAt   time.Time   // when that probe's lease runs out
	leaseAt   time.Time   // this process's lease as the store holds it: its last write that landed, or its last load
	renewFail time.Time   // when a renewal of the lease last failed to land; zero: none since

	errs int64
	down bool
	err  error
}

// change is one decision of this process that the store has not taken
// yet: an outcome learned, or a request let through.
type change struct {
	at      time.Time
	observe bool
	t       ticket
	o       outcome
	in      uint64 // the first write, by this process's count, whose fate is not known that held it; 0: none
}

// request is a decision waiting for a sync.
type request struct {
	kind  requestKind
	now   time.Time
	w     *waiter   // admit: the call's place in line; nil: not in line
	cost  cost      // admit: what the request is estimated to use
	start time.Time // admit: when the call's Do began
	t     ticket    // observe
	o     outcome   // observe
	v     verdict   // admit's answer
	done  chan struct{}
	gone  bool // the caller stopped waiting for the answer
}

type requestKind int

const (
	toObserve requestKind = iota // an outcome to learn
	toAdmit                      // a call asks to send
	toTurn                       // the line's turn: a timer or a change woke it
)

// fleetOf returns b's fleet part, making it on first use; b.mu is held.
func (b *Breaker) fleetOf() *fleet {
	if b.fleet == nil {
		b.fleet = &fleet{id: fmt.Sprintf("%016x", fleetIDs.Add(1)), dirty: true}
	}
	return b.fleet
}

// fleetIDs names the Breakers of this process in their stores: counting
// from a random start, so that the processes of a fleet do not meet, and
// fixed-width, so that within one process the names sort in the order the
// Breakers first shared their state on every run of the same program
// (a replay in virtual time orders them alike).
var fleetIDs = func() *atomic.Uint64 {
	var n atomic.Uint64
	n.Store(rand.Uint64() &^ (1 << 63))
	return &n
}()

// adoptRead makes st, read at version ver, the view at now, base being
// the changes heard before it was read. b.mu is held.
func (b *Breaker) adoptRead(st shared, ver int64, now time.Time, base uint64) {
	f := b.fleet
	b.adopt(st, ver, now)
	if e := b.entry(f.id); e != nil {
		f.leaseAt = e.Lease
		// What a write whose answer was lost held is in the state if
		// that write, or a later one, landed.
		f.carry = slices.DeleteFunc(f.carry, func(c change) bool { return c.in != 0 && c.in <= e.Wseq })
	}
	f.dirty, f.behind, f.base, f.mine = false, false, base, 0
}

// freshen brings the view up to the newest state the store's notices
// carried, when the store keeps it ([StateNotifier]), and reports
// whether the view is then the state as far as the notices tell: no
// load is needed. A view at a version newer than the notices' holds a
// write of this process's own that they have not told of yet; one that
// a compare-and-swap found behind, or that holds decisions whose write
// failed, newer than the notices', is not the state until a notice or a
// load says what is. While a write is on its way the view is the write's,
// and the sync that made it holds a count of carry: a notice, even of
// that very write, waits for its answer. b.mu is held.
func (b *Breaker) freshen(now time.Time) bool {
	n, ok := b.Store.(StateNotifier)
	f := b.fleetOf()
	if !ok || f.writing {
		return false
	}
	data, ver, ok := n.Noticed(b.Key)
	switch {
	case !ok:
		return false
	case ver > f.version || (ver == f.version && f.dirty):
		// A newer state; or the view's own, under decisions the store
		// may not have taken, which are made on it again.
		st, err := decodeShared(data)
		if err != nil {
			return false // a load says what is wrong
		}
		b.adoptRead(st, ver, now, f.changes)
	case f.behind || f.dirty:
		return false
	}
	return true
}

// applyCarry makes on a view read from the store what this process
// decided that the store has not taken, once. b.mu is held.
func (b *Breaker) applyCarry() {
	f := b.fleet
	if f.inView {
		return
	}
	for _, c := range f.carry {
		b.apply(c)
	}
	f.inView = true
}

// stale reports whether another process may have changed the state
// since the view was read or written: more changes were heard since than
// this process wrote, or changes go unheard. So a process that writes
// does not read its own write back. A notice taken for this process's
// own that was another's (two writes, one notice) costs no safety: a
// decision that changes the state is written by compare-and-swap on the
// view's version, which then fails and reads; one that writes nothing (a
// call held back, or let through while the backend has never reported)
// is as if made a moment before that write. b.mu is held.
func (f *fleet) stale() bool {
	return f.dirty || f.behind || f.watch == nil || f.changes-f.base > f.mine
}

// lease is how long what this process holds in the store counts when it
// never says more.
func (b *Breaker) lease() time.Duration { return cmp.Or(b.ProbeLease, DefaultProbeLease) }

// fleetAdmit is admit with a Store.
func (b *Breaker) fleetAdmit(now time.Time, w *waiter, deadline time.Time, c cost, start time.Time) verdict {
	r := &request{kind: toAdmit, now: now, w: w, cost: c, start: start}
	if b.await(r, deadline) {
		return r.v
	}
	// Its deadline came while the store was slow: held back, as the view
	// holds it, or, when the view would let it go, by its turn.
	b.mu.Lock()
	defer b.mu.Unlock()
	if v := b.rules(time.Now(), b.allWaiting(), c); !v.pass {
		return v
	}
	return b.onTurn()
}

// fleetWait is wait with a Store: the call stands in this process's
// line, and the fleet's through this process's entry.
func (b *Breaker) fleetWait(now time.Time, w *waiter, start, end time.Time, v verdict, deadline time.Time, c cost) *waiter {
	b.mu.Lock()
	w = b.stand(now, w, start, end, v, c)
	b.fleetOf()
	b.watchAsNeeded()
	if !b.headMoved() {
		// Behind this process's first call: nothing the fleet sees has
		// changed, and its turn is as it was.
		b.scheduleFleet(now)
		b.mu.Unlock()
		return w
	}
	b.mu.Unlock()
	b.await(&request{kind: toTurn, now: now}, deadline)
	return w
}

// headMoved reports whether this process's line now has another first
// call than its entry in the state says (the line's turn may have come,
// and the fleet must see it), or has just become empty or not. b.mu is
// held.
func (b *Breaker) headMoved() bool {
	var head time.Time
	if w := b.line.first(); w != nil {
		head = w.start
	}
	var published time.Time
	if e := b.entry(b.fleet.id); e != nil && e.Waiting > 0 {
		published = e.Head
	}
	return !head.Equal(published)
}

// fleetExpire is expire with a Store: the call goes if it was let
// through in time, and otherwise leaves.
func (b *Breaker) fleetExpire(now time.Time, w *waiter, deadline time.Time) (verdict, bool) {
	b.mu.Lock()
	if w.granted {
		w.granted = false
		b.mu.Unlock()
		return verdict{pass: true, t: w.t}, true
	}
	b.remove(w)
	if !b.headMoved() {
		b.scheduleFleet(now)
		b.mu.Unlock()
		return w.v, false
	}
	b.mu.Unlock()
	b.await(&request{kind: toTurn, now: now}, deadline)
	return w.v, false
}

// fleetLeave is leave with a Store.
func (b *Breaker) fleetLeave(w *waiter, deadline time.Time) {
	now := time.Now()
	b.mu.Lock()
	var back *request
	if w.granted {
		w.granted = false
		back = &request{kind: toObserve, now: now, t: w.t, o: outcome{kind: KindCancelled}}
	}
	b.remove(w)
	if back == nil && !b.headMoved() {
		b.scheduleFleet(now)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	if back != nil {
		b.enqueue(back)
	}
	b.await(&request{kind: toTurn, now: now}, deadline)
}

// fleetObserve is observe with a Store.
func (b *Breaker) fleetObserve(now time.Time, t ticket, o *outcome, deadline time.Time) {
	b.await(&request{kind: toObserve, now: now, t: t, o: *o}, deadline)
}

// fleetTick is tick with a Store.
func (b *Breaker) fleetTick() {
	b.mu.Lock()
	b.timerAt = time.Time{}
	b.mu.Unlock()
	b.enqueue(&request{kind: toTurn, now: time.Now()})
}

// await hands r to the next sync and waits until it is decided, or
// until deadline (zero: none): no call waits for the store past its
// deadline. It reports whether r was decided. Otherwise the sync goes on
// without its caller, to write what r changes however soon the caller
// stopped, except for a call that asks which no sync has taken yet: it
// is decided here, on the view, and what that changes goes with the next
// write. A call that asks and is already in a sync is abandoned (gone):
// what the sync lets through for it goes back.
func (b *Breaker) await(r *request, deadline time.Time) bool {
	r.done = make(chan struct{})
	b.enqueue(r)
	if deadline.IsZero() {
		<-r.done
		return true
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-r.done:
		return true
	case <-t.C:
	}
	b.mu.Lock()
	f := b.fleet
	select {
	case <-r.done:
		b.mu.Unlock()
		return true
	default:
	}
	if i := slices.Index(f.pending, r); i >= 0 && r.kind == toAdmit {
		f.pending = slices.Delete(f.pending, i, i+1)
		now := time.Now()
		f.local, f.unwritten = true, true
		d := b.decideBatch(now, []*request{r})
		f.local = false
		f.carry = append(f.carry, d.wrote...)
		b.mu.Unlock()
		b.deliver([]*request{r}, d, now)
		return true
	}
	r.gone = true
	b.mu.Unlock()
	return false
}

// enqueue hands r to the next sync, starting one when none runs.
func (b *Breaker) enqueue(r *request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.fleetOf()
	f.pending = append(f.pending, r)
	if !f.syncing {
		f.syncing = true
		go b.syncLoop()
	}
}

// syncLoop runs syncs until no decision is due.
func (b *Breaker) syncLoop() {
	for {
		b.mu.Lock()
		f := b.fleet
		if len(f.pending) == 0 {
			f.syncing = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		// Every decision due at this instant joins the batch: the other
		// calls of the instant ask while this waits. It costs a timer's
		// round trip, next to a store's milliseconds; and in virtual time
		// the batch, and so what the store is asked, does not depend on
		// which goroutine ran first. Two nanoseconds, not one: a store
		// that tells its watchers of a write a nanosecond after it (as
		// llmretrytest.MemoryStore does) has then told of this process's
		// own last write before the sync decides whether to load.
		time.Sleep(2 * time.Nanosecond)
		b.mu.Lock()
		batch := f.pending
		f.pending = nil
		b.mu.Unlock()
		slices.SortStableFunc(batch, inTurn)
		b.sync(batch)
	}
}

// inTurn orders a batch's decisions as they are made whatever order
// they were asked in: outcomes by their admission, then the calls that
// ask, by when their Do began.
func inTurn(a, b *request) int {
	if c := cmp.Compare(a.kind, b.kind); c != 0 {
		return c
	}
	switch a.kind {
	case toObserve:
		return cmp.Compare(a.t.seq, b.t.seq)
	case toAdmit:
		return a.start.Compare(b.start)
	}
	return 0
}

// sync makes the decisions of batch on the shared state.
func (b *Breaker) sync(batch []*request) {
	now := time.Now()
	for _, r := range batch {
		now = later(now, r.now)
	}
	ctx, cancel := b.storeContext(now)
	defer cancel()
	mustLoad := false
	for try := 0; ; try++ {
		b.mu.Lock()
		f := b.fleet
		stale := mustLoad || (!b.freshen(now) && f.stale())
		onView := stale && !mustLoad && !f.unwritten && b.settledOnView(now, batch)
		load := (stale && !onView) || f.version == 0
		heard := f.changes
		b.mu.Unlock()
		if load {
			data, ver, err := b.Store.Load(ctx, b.Key)
			var st shared
			if err == nil {
				st, err = decodeShared(data)
			}
			if err != nil {
				b.decideLocally(now, batch, err)
				return
			}
			b.mu.Lock()
			// A change heard while the load was on its way may not be in
			// what it read.
			b.adoptRead(st, ver, now, heard)
			f.down = false // the store answered
			b.mu.Unlock()
		}
		b.mu.Lock()
		before := b.view()
		d := b.decideBatch(now, batch)
		after := b.view()
		var next []byte
		changed := d.renew || !sameView(material(before, f.id), material(after, f.id))
		if !changed && !load && !mustLoad && b.heldByOthersProbe(batch) {
			// Held back, on the notices alone, by another process's
			// probe, whose outcome may be a notice still on its way: a
			// skip costs the call more than a load. Read, and decide
			// again.
			b.restore(before)
			b.mu.Unlock()
			mustLoad = true
			continue
		}
		if !changed && !sameView(before, after) {
			// Only counts that matter once the backend reports, and how
			// many of this process's calls wait: they go with the next
			// write.
			f.carry = append(f.carry, d.wrote...)
			b.mu.Unlock()
			b.deliver(batch, d, now)
			return
		}
		if changed && onView {
			// The view did not settle it after all: read, and decide again.
			b.restore(before)
			b.mu.Unlock()
			mustLoad = true
			continue
		}
		var held int // how much of carry the write holds: what is added while it is on its way is not in it
		if changed {
			if e := b.entry(f.id); e != nil {
				e.Waiting = b.line.waiting() - len(d.takes)
				if d.turn.let != nil {
					e.Waiting--
				}
			}
			f.wseq++
			e := b.ownEntry(now)
			// Every write renews the lease: a process that writes is
			// alive, and its requests in flight are still out.
			e.Wseq, e.Lease = f.wseq, now.Add(b.lease())
			st := b.view()
			next, held = encodeShared(&st), len(f.carry)
		}
		ver := f.version
		f.writing = changed
		b.mu.Unlock()
		if !changed {
			b.deliver(batch, d, now)
			return
		}
		ok, err := b.Store.CompareAndSwap(ctx, b.Key, ver, next)
		switch {
		case err != nil:
			// Decided on the fleet's state, but whether the write landed
			// is not known: the view holds the decision, and what it
			// changed is kept, to be made again unless the state shows
			// the write landed. A request it let through is then counted
			// by this process alone, as one let through while the store
			// failed is: the fleet may never have numbered it.
			b.mu.Lock()
			f.writing = false
			f.unwritten = true
			localize(batch, &d)
			for i := range f.carry[:held] {
				if f.carry[i].in == 0 {
					f.carry[i].in = f.wseq
				}
			}
			for i := range d.wrote {
				d.wrote[i].in = f.wseq
			}
			f.carry = append(f.carry, d.wrote...)
			f.dirty = true
			if d.renew {
				f.renewFail = now
			}
			b.fail(err)
			b.mu.Unlock()
			b.deliver(batch, d, now)
			return
		case ok:
			b.mu.Lock()
			f.writing = false
			f.version = ver + 1
			if e := b.entry(f.id); e != nil {
				f.leaseAt, f.renewFail = e.Lease, time.Time{}
			}
			// The write proves the view was the state; the one change
			// it makes is this process's own.
			f.base, f.mine = heard, 1
			f.carry = slices.Delete(f.carry, 0, held)
			f.unwritten = len(f.carry) > 0
			f.down = false
			b.mu.Unlock()
			b.deliver(batch, d, now)
			return
		}
		// Another process wrote first: decide again on its state, after
		// a pause that grows with each try. (A process that lost has lost
		// to a write that is done, so the two do not collide again in
		// step; without jitter, replays of a fleet in virtual time stay
		// identical.)
		b.mu.Lock()
		f.writing = false
		f.down = false // the store answered
		b.restore(before)
		f.wseq--
		f.behind = true
		// Notices may trail the store under contention: after a second
		// loss, read it.
		mustLoad = mustLoad || try >= 1
		b.mu.Unlock()
		if !pause(ctx, time.Millisecond<<min(try, 6)) {
			b.decideLocally(now, batch, errStoreBusy)
			return
		}
	}
}

// heldByOthersProbe reports whether decision batch held back a call
// that asked because another process's probe is in flight. b.mu is held.
func (b *Breaker) heldByOthersProbe(batch []*request) bool {
	f := b.fleet
	if !b.health.probing || strings.HasPrefix(f.probe, f.id+"/") {
		return false
	}
	for _, r := range batch {
		if r.kind == toAdmit && !r.gone && !r.v.pass {
			return true
		}
	}
	return false
}

// localize makes the requests that decision d of batch let through
// requests numbered by this process alone, in its changes and in the
// tickets it hands their callers.
func localize(batch []*request, d *syncDecision) {
	for i := range d.wrote {
		if !d.wrote[i].observe {
			d.wrote[i].t.local = true
		}
	}
	d.turn.t.local = true
	for _, r := range batch {
		if r.kind == toAdmit && r.v.pass {
			r.v.t.local = true
		}
	}
}

// pause waits for d, and reports false when ctx ends first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errStoreBusy is the store error of a decision whose every write found
// the state changed by another process, until its time ran out.
var errStoreBusy = errors.New("llmretry: breaker store: the state changed on every try")

// settledOnView reports whether the view, stale as it may be, decides
// batch as the fleet's state would, so that no load is worth its cost:
// every call that asks is one the view holds back while the breaker is
// open (until then nothing but a success sent before it opened closes it,
// and the skip is the safe side of that), and every outcome is a success
// of a backend closed with no failure counted that has never reported
// (it changes nothing but counts that pace nothing yet; they go with the
// next write). A success that would have reset failures another process
// counted since the view was read goes unwritten: those failures count
// across it, a breaker opened a little sooner. b.mu is held.
func (b *Breaker) settledOnView(now time.Time, batch []*request) bool {
	h := &b.health
	for _, r := range batch {
		switch {
		case r.kind == toAdmit && r.w == nil && now.Before(h.until):
		case r.kind == toObserve && r.o.ok && h.until.IsZero() && h.fails == 0 && !b.pacing.has && !r.t.probe:
		default:
			return false
		}
	}
	return true
}

// storeContext bounds the store calls of a sync by StoreTimeout, and by
// nothing shorter: a call whose deadline comes first stops waiting for
// the sync (await), while the sync goes on for the others, and to write
// what was decided.
func (b *Breaker) storeContext(now time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.Background(), now.Add(cmp.Or(b.StoreTimeout, DefaultStoreTimeout)))
}

// decideLocally makes the decisions of batch on the view, as the store
// failed with err: what they change is kept, to be written with the next
// write that succeeds.
func (b *Breaker) decideLocally(now time.Time, batch []*request, err error) {
	b.mu.Lock()
	f := b.fleet
	b.fail(err)
	f.dirty = true
	f.local, f.unwritten = true, true
	d := b.decideBatch(now, batch)
	f.local = false
	f.carry = append(f.carry, d.wrote...)
	if d.renew {
		f.renewFail = now
	}
	b.mu.Unlock()
	b.deliver(batch, d, now)
}

// fail counts a failed store call; b.mu is held. A store that answers
// but whose state others changed on every try is not down.
func (b *Breaker) fail(err error) {
	f := b.fleet
	f.errs++
	f.err = err
	if err != errStoreBusy {
		f.down = true
	}
}

// adopt makes st, read at version ver, the view, at now. b.mu is held.
func (b *Breaker) adopt(st shared, ver int64, now time.Time) {
	f := b.fleet
	h := &b.health
	*h = health{fails: st.Fails, until: st.Until, kind: st.Kind, hinted: st.Hinted, opened: st.Opened}
	h.probing = st.ProbeOwner != "" && now.Before(st.ProbeUntil)
	f.probe, f.probeAt = "", time.Time{}
	if h.probing {
		f.probe, f.probeAt = st.ProbeOwner, st.ProbeUntil
	}
	p := &b.pacing
	*p = pacing{reportSeq: st.ReportSeq, reportBase: st.ReportBase, admitted: st.Admitted, back: st.Back, tokenUse: st.TokenUse,
		est: st.Est, estBack: st.EstBack, reportEst: st.ReportEst, reportOwn: st.ReportOwn,
		over: st.Over, reportOver: st.ReportOver, reportOwnOver: st.OwnOver}
	if st.Report != nil {
		p.report, p.has = st.Report.limitReport(), true
	}
	p.recent = recent{at: st.Recent, folded: st.Folded, foldedAt: st.FoldedAt}
	b.line.gate = st.Gate
	f.procs = st.Procs
	f.inView = false
	f.version = ver
}

// view is the shared state as this process sees it; b.mu is held.
func (b *Breaker) view() shared {
	f := b.fleet
	h, p := &b.health, &b.pacing
	st := shared{
		Fails: h.fails, Until: h.until, Kind: h.kind, Hinted: h.hinted, Opened: h.opened,
		ReportSeq: p.reportSeq, ReportBase: p.reportBase, Admitted: p.admitted, Back: p.back, TokenUse: p.tokenUse,
		Est: p.est, EstBack: p.estBack, ReportEst: p.reportEst, ReportOwn: p.reportOwn,
		Over: p.over, ReportOver: p.reportOver, OwnOver: p.reportOwnOver,
		Recent: slices.Clone(p.recent.at), Folded: p.recent.folded, FoldedAt: p.recent.foldedAt,
		Gate:  b.line.gate,
		Procs: slices.Clone(f.procs),
	}
	if h.probing {
		st.ProbeOwner, st.ProbeUntil = f.probe, f.probeAt
	}
	if p.has {
		st.Report = toSharedReport(p.report)
	}
	return st
}

// restore makes st the view again, undoing decisions the store did not
// take. b.mu is held.
func (b *Breaker) restore(st shared) {
	f := b.fleet
	b.adopt(st, f.version, time.Time{})
	b.health.probing = st.ProbeOwner != ""
	if b.health.probing {
		f.probe, f.probeAt = st.ProbeOwner, st.ProbeUntil
	}
}

// sameView reports whether two views hold the same state.
func sameView(a, b shared) bool {
	return string(encodeShared(&a)) == string(encodeShared(&b))
}

// material is st less what need not be written at once: the counts of
// requests let through and back while the backend has never reported
// (they pace nothing until it does, and go with the next write), and how
// many calls of process id wait beyond its first (others count them only
// to be safe).
func material(st shared, id string) shared {
	st.Procs = slices.Clone(st.Procs)
	for i := range st.Procs {
		e := &st.Procs[i]
		if e.ID == id {
			e.Waiting = min(e.Waiting, 1)
		}
		if st.Report == nil {
			e.InFlight = 0
		}
	}
	if st.Report == nil {
		st.Admitted, st.Back, st.Recent, st.Folded, st.FoldedAt = 0, 0, nil, 0, time.Time{}
		st.Est, st.EstBack, st.Over = costs{}, costs{}, costs{}
	}
	return st
}

// entry is the entry of process id in the view; nil when it has none.
// b.mu is held.
func (b *Breaker) entry(id string) *procEntry {
	for i := range b.fleet.procs {
		if b.fleet.procs[i].ID == id {
			return &b.fleet.procs[i]
		}
	}
	return nil
}

// ownEntry is this process's entry, made when missing; b.mu is held.
func (b *Breaker) ownEntry(now time.Time) *procEntry {
	f := b.fleet
	if e := b.entry(f.id); e != nil {
		return e
	}
	f.procs = append(f.procs, procEntry{ID: f.id, Lease: now.Add(b.lease())})
	slices.SortFunc(f.procs, func(a, b procEntry) int { return cmp.Compare(a.ID, b.ID) })
	return b.entry(f.id)
}

// syncDecision is what a sync decided: the changes it made to the shared
// state (to carry if the store does not take them), the line's turn, and
// the calls whose asking took them out of line.
type syncDecision struct {
	wrote []change
	turn  lineTurn
	takes []*waiter
	renew bool // the lease is renewed: a write is due though nothing else changed
}

// decideBatch makes the decisions of batch on the view, at now: the
// outcomes first, then the line's turn, then the calls that ask. It
// changes the view but not the line, which deliver changes once the
// decision stands. b.mu is held.
func (b *Breaker) decideBatch(now time.Time, batch []*request) syncDecision {
	f := b.fleet
	var d syncDecision
	b.expireProcs(now)
	b.applyCarry()
	if r := b.renewal(); !r.IsZero() && !now.Before(r) {
		b.entry(f.id).Lease = now.Add(b.lease())
		d.renew = true
	}
	for _, r := range batch {
		if r.kind == toObserve {
			c := change{at: r.now, observe: true, t: r.t, o: r.o}
			b.apply(c)
			d.wrote = append(d.wrote, c)
		}
	}
	d.turn = b.turn(now)
	if d.turn.let != nil {
		d.wrote = append(d.wrote, change{at: now, t: d.turn.t})
	}
	for _, r := range batch {
		if r.kind != toAdmit || r.gone {
			continue
		}
		switch w := r.w; {
		case w != nil && w.granted:
			r.v = verdict{pass: true, t: w.t}
		case w != nil && w == d.turn.let:
			// Let through by this very turn: the answer, not a wake.
			r.v = verdict{pass: true, t: d.turn.t}
			d.turn.let = nil
			d.takes = append(d.takes, w)
		default:
			v, take := b.answer(now, w, r.cost)
			r.v = v
			if take {
				d.takes = append(d.takes, w)
			}
			if v.pass {
				d.wrote = append(d.wrote, change{at: now, t: v.t})
			}
		}
	}
	b.publish(now, d)
	return d
}

// apply makes change c on the view; b.mu is held.
func (b *Breaker) apply(c change) {
	e := b.ownEntry(c.at)
	if !c.observe {
		// A request let through while the store failed: the fleet
		// counts it in flight from now.
		if c.t.local {
			b.pacing.admit(c.at, !b.NoPacing, c.t.cost)
			e.InFlight++
			e.Est = e.Est.plus(c.t.cost)
		}
		return
	}
	e.InFlight = max(e.InFlight-1, 0)
	e.Est = e.Est.minus(costs{}.plus(c.t.cost)).atLeastZero()
	b.settle(c.at, c.t, &c.o)
}

// renewal is when this process writes to renew its entry's lease while
// requests of its own are out, though it has nothing else to write: a
// quarter of the lease before it runs out in the store, for the others
// would then take those requests as back while they still use the
// provider's buckets (an agent's turn may stream for minutes); after a
// renewal that failed to land, a sixteenth of the lease later, so that a
// store that is down is not asked in a loop. Zero while none are out, and
// while the backend has never reported: its counts pace nothing yet (see
// material). b.mu is held.
func (b *Breaker) renewal() time.Time {
	f := b.fleet
	e := b.entry(f.id)
	if e == nil || e.InFlight <= 0 || !b.pacing.has {
		return time.Time{}
	}
	due := f.leaseAt.Add(-b.lease() / 4)
	if !f.renewFail.Before(due) {
		due = f.renewFail.Add(b.lease() / 16)
	}
	return due
}

// probeName is the owner name of the probe let through with ticket t.
func (b *Breaker) probeName(t ticket) string {
	return b.fleet.id + "/" + strconv.FormatUint(t.seq, 10)
}

// expireProcs drops the entries of processes whose lease ran out by now:
// their requests are taken as back, and a probe they held is free. b.mu
// is held.
func (b *Breaker) expireProcs(now time.Time) {
	f := b.fleet
	f.procs = slices.DeleteFunc(f.procs, func(e procEntry) bool {
		if e.ID == f.id || now.Before(e.Lease) {
			return false
		}
		p := &b.pacing
		p.back = min(p.back+uint64(max(e.InFlight, 0)), p.admitted)
		p.estBack = p.estBack.add(e.Est)
		return true
	})
	if b.health.probing && !f.probeAt.IsZero() && !now.Before(f.probeAt) {
		b.health.probing, f.probe, f.probeAt = false, "", time.Time{}
	}
}

// othersAhead is how many calls of other processes stand before a call
// begun at start in the fleet's line: every call of each process whose
// first call began earlier (the safe side: they may all have). Without a
// Store, none. b.mu is held.
func (b *Breaker) othersAhead(start time.Time) int {
	return b.linesAhead(start).calls
}

// allWaiting is how many calls stand before one that is not in line:
// every call of this process's line, and, with a Store, of the other
// processes' lines. b.mu is held.
func (b *Breaker) allWaiting() int {
	return b.line.waiting() + b.othersAhead(maxTime)
}

// linesBefore is what of other processes' lines stands before a call.
type linesBefore struct {
	calls int       // their calls
	lines int       // the processes
	lease time.Time // the earliest of their leases: if it runs out, that process's line is gone
}

// linesAhead is what of other processes' lines stands before a call
// begun at start. b.mu is held.
func (b *Breaker) linesAhead(start time.Time) linesBefore {
	var a linesBefore
	f := b.fleet
	if f == nil || b.Store == nil {
		return a
	}
	for _, e := range f.procs {
		if e.ID == f.id || e.Head.IsZero() || e.Waiting == 0 {
			continue
		}
		if e.Head.Before(start) || (e.Head.Equal(start) && e.ID < f.id) {
			a.calls += e.Waiting
			a.lines++
			a.lease = earliest(a.lease, e.Lease)
		}
	}
	return a
}

// maxTime is later than any call's start.
var maxTime = time.Unix(1<<62, 0)

// publish writes this process's line, as it stands once d is carried
// out, into its entry. An entry that holds nothing stays until its lease
// runs out, which any process then drops: dropping it at once would cost
// a write of its own, and with it the count of this process's writes
// that tells whether a write whose answer was lost landed. b.mu is held.
func (b *Breaker) publish(now time.Time, d syncDecision) {
	f := b.fleet
	head, n := time.Time{}, b.line.waiting()
	first := b.line.first()
	if first != nil && (first == d.turn.let || slices.Contains(d.takes, first)) {
		first = b.line.queue.second()
		n--
	}
	if first != nil {
		head = first.start
	}
	e := b.entry(f.id)
	if e == nil {
		if n == 0 {
			return
		}
		e = b.ownEntry(now)
	}
	if !e.Head.Equal(head) || (e.Waiting == 0) != (n == 0) {
		e.Head, e.Waiting = head, n
		e.Lease = now.Add(b.lease())
	}
}

// deliver carries out decision d of batch, hands the answers to their
// callers, and returns to the breaker the admissions of callers that
// stopped waiting.
func (b *Breaker) deliver(batch []*request, d syncDecision, now time.Time) {
	var back []*request
	b.mu.Lock()
	b.carryOut(d.turn)
	for _, w := range d.takes {
		b.remove(w)
	}
	b.endWaits(now)
	for _, r := range batch {
		if r.done == nil {
			continue
		}
		if r.gone && r.v.pass {
			back = append(back, &request{kind: toObserve, now: now, t: r.v.t, o: outcome{kind: KindCancelled}})
		}
		close(r.done)
	}
	b.scheduleFleet(now)
	b.mu.Unlock()
	for _, r := range back {
		b.enqueue(r)
	}
}

// scheduleFleet sets the timer for the next time this process's first
// call's lot can change by the view, and says whether a change by
// another process should wake the line now. b.mu is held.
func (b *Breaker) scheduleFleet(now time.Time) {
	f := b.fleet
	b.watchAsNeeded()
	w := b.line.first()
	f.listen = false
	if w == nil {
		next := b.renewal()
		if e := b.line.ends.min(); e != nil {
			next = earliest(next, e.end)
		}
		b.setTimer(now, next)
		return
	}
	others := b.linesAhead(w.start)
	ahead := others.calls
	h := &b.health
	var next time.Time
	switch {
	case now.Before(h.until):
		next = h.until
	case !h.until.IsZero():
		// Half-open with a probe in flight: its outcome is another
		// process's write, or this one's.
		f.listen = true
		next = f.probeAt
	default:
		// The line goes no sooner than the gate, the calls ahead a
		// handOff apart, and then as pacing lets it: a line that pacing
		// holds past the gate is not woken at the gate only to load the
		// state and find that.
		at := now
		if now.Before(b.line.gate) {
			at = b.line.gate.Add(time.Duration(ahead) * handOff)
		}
		held, until := b.pacing.hold(at, int64(ahead), w.cost)
		switch {
		case (b.NoPacing || !held) && at.After(now):
			next = at
		case b.NoPacing || !held:
			// Others ahead are let go first, a handOff apart.
			next = now.Add(time.Duration(max(ahead, 1)) * handOff)
		case !until.IsZero():
			// The provider admits the next request at until. With other
			// processes' lines ahead, each of which takes at least one
			// admission before this line's turn, the turn comes no sooner
			// than the admissions beyond what until brings, a pace apart:
			// waking every line at until would load the state once for
			// each, for one request let through.
			next = until
			if extra := int64(others.lines) + 1 - b.pacing.room(until, w.cost); others.lines > 0 && extra > 0 {
				next = until.Add(time.Duration(extra) * b.pacing.pace())
			}
		case ahead == 0:
			// The fleet's first, waiting for an answer: the provider's
			// pace says when the next is due.
			next = now.Add(b.pacing.pace())
		default:
			// Other processes' lines ahead, waiting for answers: each
			// lets a call go at the provider's pace, so this line's turn
			// comes no sooner than one pace for each of them. (A turn
			// missed by waking late is not lost: the calls behind count
			// this one ahead of them, and it goes when it wakes.)
			next = now.Add(time.Duration(max(others.lines, 1)) * b.pacing.pace())
		}
		next = later(next, at)
	}
	// A process ahead that died holds the line until its lease runs out.
	next = earliest(next, others.lease)
	next = earliest(next, b.renewal())
	if e := b.line.ends.min(); e != nil {
		next = earliest(next, e.end)
	}
	b.setTimer(now, next)
}

// watchAsNeeded starts the watch of the key while this process has calls
// waiting, and stops it when it has none. Only a watch tells of
// another's change, so without one every decision reads the state first.
// b.mu is held.
func (b *Breaker) watchAsNeeded() {
	f := b.fleet
	busy := !b.line.empty()
	switch {
	case busy && f.watch == nil:
		ctx, cancel := context.WithCancel(context.Background())
		f.watch = cancel
		go b.watchLoop(ctx)
	case !busy && f.watch != nil:
		f.watch()
		f.watch = nil
		// Unwatched, changes go unheard: read before the next decision.
		f.dirty = true
	}
}

// sharedPoll is how often a waiting process looks at the state when its
// store cannot watch.
const sharedPoll = 500 * time.Millisecond

// watchLoop marks the view stale on every change another process makes,
// and wakes the line when it listens; it polls when the store cannot
// watch.
func (b *Breaker) watchLoop(ctx context.Context) {
	// A watch that fails is no decision: the view is then only ever
	// taken as stale, and waiting calls poll.
	ch, err := b.Store.Watch(ctx, b.Key)
	var tick <-chan time.Time
	if err != nil || ch == nil {
		t := time.NewTicker(sharedPoll)
		defer t.Stop()
		tick = t.C
	}
	// A change made before the watch began went unheard.
	b.heard(false)
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				ch = nil
				if tick == nil {
					t := time.NewTicker(sharedPoll)
					defer t.Stop()
					tick = t.C
				}
				continue
			}
			b.heard(true)
		case <-tick:
			b.heard(false)
		}
	}
}

// heard records a change of the state (notice: a watch's notice; false:
// the watch began, or polls) and, when the line listens, gives the line
// its turn. A notice is counted against this process's own writes since
// the view was last known to be the state (stale); anything else makes
// the view stale.
func (b *Breaker) heard(notice bool) {
	b.mu.Lock()
	f := b.fleet
	f.changes++
	// A notice may stand for several changes (the channel holds one):
	// a line that listens for the probe's outcome reads on each, lest it
	// take one for this process's own write and miss the outcome.
	f.dirty = f.dirty || !notice || f.listen
	listen := f.listen
	b.mu.Unlock()
	if listen {
		b.enqueue(&request{kind: toTurn, now: time.Now()})
	}
}
