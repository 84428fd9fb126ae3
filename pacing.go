package llmretry

import (
	"math"
	"math/bits"
	"sort"
	"time"
)

// pacing is what a Breaker knows of its provider's rate limits: the
// freshest report, and counts of the requests let through around and
// after it. The rules are on [Breaker]; this file computes them, in time
// and memory that do not grow with the calls in flight or waiting:
//
//   - S, the requests let through since the report's request was sent
//     and those still in flight then, is admitted − base − 1: every
//     admission but those whose outcome came back before the report's
//     request was let through (base, counted when it was) and that
//     request itself. A request let through before the report's and back
//     between that one's admission and its send is counted too: which
//     reached the provider first is not known, and counting it is the
//     safe side.
//   - The requests in flight are admitted − back.
//   - The window rule counts the requests let through in the last W from
//     recent, which holds the times of those let through since the
//     report's own and is emptied by a fresher report; it is bounded,
//     and what it folds into a count can only overstate the window.
type pacing struct {
	report     limitReport // the freshest report; valid when has
	has        bool
	reportSeq  uint64 // the admission of the report's own request
	reportBase uint64 // outcomes observed before that admission
	admitted   uint64 // requests let through so far: the last one's number
	back       uint64 // outcomes of them observed so far
	recent     recent // when requests were let through after the report's own, while there is a report
	tokenUse   int64  // tokens a request uses, as the reports' drop says; 0 until known

	// What the requests let through were estimated to use (their
	// Backend's Estimate), counted as admitted and back are: S in tokens
	// is est − reportEst − reportOwn, the estimates of the requests S
	// counts.
	est, estBack         costs
	reportEst, reportOwn costs // estBack when the report's request was let through, and its own estimate
	// over sums what the requests back with their usage were estimated
	// beyond it: S's estimates are settled by it once their answers say
	// what they used.
	over, reportOver, reportOwnOver costs
}

// cost is what one request is estimated to use of the provider's token
// buckets before it is sent; the zero cost is not known.
type cost struct{ in, out int64 }

func (c cost) known() bool { return c.in > 0 || c.out > 0 }

// costs sums the estimates of requests: how many had one, and their
// input and output tokens.
type costs struct{ N, In, Out int64 }

func (a costs) plus(c cost) costs {
	if !c.known() {
		return a
	}
	return costs{a.N + 1, a.In + c.in, a.Out + c.out}
}

func (a costs) add(b costs) costs   { return costs{a.N + b.N, a.In + b.In, a.Out + b.Out} }
func (a costs) minus(b costs) costs { return costs{a.N - b.N, a.In - b.In, a.Out - b.Out} }

func (a costs) atLeastZero() costs { return costs{max(a.N, 0), max(a.In, 0), max(a.Out, 0)} }

// beyond is what estimate c said beyond what was used, u.
func (c cost) beyond(u cost) cost { return cost{max(c.in-u.in, 0), max(c.out-u.out, 0)} }

// ticket is an admission: what a Breaker hands a request it lets
// through, and the request hands back with its outcome.
type ticket struct {
	seq      uint64 // the admission's number, from 1
	overBase costs  // over when it was let through
	base     uint64 // outcomes observed before it: S counts from it when its report is the freshest
	cost     cost   // its estimate, counted against the token buckets until a report sent after it
	estBase  costs  // the estimates of the outcomes observed before it
	probe    bool   // the half-open probe
	local    bool   // let through by a Breaker whose store had failed: the fleet did not number it
}

// admit counts a request let through at now, and returns its ticket.
// Its time is recorded for the window rule only once the backend has
// reported: a backend that never reports is never paced.
func (p *pacing) admit(now time.Time, record bool, c cost) ticket {
	p.admitted++
	if record && p.has {
		p.recent.add(now)
	}
	t := ticket{seq: p.admitted, base: p.back, cost: c, estBase: p.estBack, overBase: p.over}
	p.est = p.est.plus(c)
	return t
}

// inFlight is how many requests let through have not come back.
func (p *pacing) inFlight() int64 { return int64(p.admitted - p.back) }

// sentSince is S for the freshest report.
func (p *pacing) sentSince() int64 {
	if !p.has || p.admitted < p.reportBase+1 {
		return 0
	}
	return int64(p.admitted - p.reportBase - 1)
}

// estSince is the estimates of the requests S counts.
func (p *pacing) estSince() costs {
	if !p.has {
		return costs{}
	}
	e := p.est.minus(p.reportEst).minus(p.reportOwn)
	settled := p.over.minus(p.reportOver).minus(p.reportOwnOver)
	e.In, e.Out = e.In-settled.In, e.Out-settled.Out
	return e.atLeastZero()
}

// tokensUsed is what the requests S counts use of the tokens bucket: their
// estimates, and the use the reports' drop says for each without one.
func (p *pacing) tokensUsed() int64 {
	e := p.estSince()
	return e.In + e.Out + max(p.sentSince()-e.N, 0)*p.tokenUse
}

// settle records that the request of ticket t came back at now, with
// rep, its rate-limit report, if it made one (hasRep), and used, what it
// used, if its answer said (known). The report becomes the freshest when
// it is fresher than the one held.
func (p *pacing) settle(now time.Time, t ticket, rep limitReport, hasRep bool, used cost) {
	if t.local {
		// Numbered by this process alone: S counts from the fleet's
		// requests in flight now.
		t.seq, t.base, t.estBase, t.overBase = p.admitted, p.back, p.estBack, p.over
	}
	var over cost
	if p.back < p.admitted {
		p.back++
		p.estBack = p.estBack.plus(t.cost)
		if t.cost.known() && used.known() {
			over = t.cost.beyond(used)
			p.over = p.over.plus(over)
		}
	}
	if !hasRep || (p.has && !fresher(&rep, &p.report)) {
		return
	}
	first := !p.has
	if !first {
		p.learnTokenUse(&rep, t)
	}
	p.report, p.has, p.reportSeq, p.reportBase = rep, true, t.seq, min(t.base, t.seq-1)
	p.reportEst, p.reportOwn = t.estBase, costs{}.plus(t.cost)
	p.reportOver, p.reportOwnOver = t.overBase, costs{}.plus(over)
	if first {
		// The requests let through while the first report was on its way
		// were not recorded: counted in the window as let through now,
		// which overstates it until W has passed.
		p.recent = recent{}
		p.recent.fold(int(p.admitted-t.seq), now)
		return
	}
	p.recent.dropBefore(p.admitted, t.seq)
}

// learnTokenUse reads, from the tokens the provider's bucket lost
// between the freshest report and rep, its successor (the report of
// ticket t), what a request of this backend uses: the drop over the
// requests let through between the two. The bucket refills meanwhile, so
// the drop can only understate the use; a drop that is not positive says
// nothing, and the last use learned stays.
func (p *pacing) learnTokenUse(rep *limitReport, t ticket) {
	old := p.report.tokens
	if !old.known || !rep.tokens.known || t.seq <= p.reportSeq {
		return
	}
	n := int64(t.seq - p.reportSeq)
	if drop := old.remaining - rep.tokens.remaining; drop > 0 {
		p.tokenUse = (drop + n - 1) / n
	}
}

// hold applies the pacing rules to a call that wants to send at now with
// k calls ahead of it in the Breaker's line. It reports whether the call
// is held back, and then until when at least (the latest next admission
// of the buckets that hold it; zero when those have come, and only an
// answer, or the window's turn, can let it go).
func (p *pacing) hold(now time.Time, k int64, c cost) (held bool, until time.Time) {
	come := true
	for _, b := range p.rooms(now, c) {
		if b.n <= k {
			held = true
			if now.Before(b.t) {
				come = false
				until = later(until, b.t)
			}
		}
	}
	if !held || (come && k == 0 && p.inFlight() == 0) {
		// Nothing in flight will bring a report: the first in line goes,
		// so that one does.
		return false, time.Time{}
	}
	return true, until
}

// room is how many more requests the freshest report lets through at
// now, by the bucket that takes the fewest: a call with at least that
// many calls ahead of it is held back (unless the liveness rule lets the
// first in line go). Without a report there is no bound: the most an
// int64 holds.
func (p *pacing) room(now time.Time, c cost) int64 {
	n := int64(math.MaxInt64)
	for _, b := range p.rooms(now, c) {
		n = min(n, b.n)
	}
	return n
}

// bucketRoom is what one of the provider's buckets takes at now, by the
// freshest report: n more requests (R − S for the requests bucket, one
// more once t, its next admission, has come, or what the window leaves
// when more; for a tokens bucket, what the tokens it holds now take, see
// tokensFor), and t.
type bucketRoom struct {
	n int64
	t time.Time
}

// rooms is what each bucket that paces a request of cost c takes at
// now; none without a report.
func (p *pacing) rooms(now time.Time, c cost) []bucketRoom {
	if !p.has {
		return nil
	}
	var out []bucketRoom
	if r := p.report.requests; r.known {
		t := p.nextAdmission()
		n := r.remaining - p.sentSince()
		if !now.Before(t) {
			n++
		}
		if m, ok := p.windowRoom(now); ok {
			n = max(n, m)
		}
		out = append(out, bucketRoom{n, t})
	}
	for _, b := range p.tokenBuckets(c) {
		n, t := tokensFor(b.reading, p.report.read, now, b.used, b.need)
		out = append(out, bucketRoom{n, t})
	}
	return out
}

// tokenBucket is one token bucket as pacing counts it for a request:
// what the report said, what the requests S counts use of it, and what
// the request needs.
type tokenBucket struct {
	reading    bucketReading
	used, need int64
}

// tokenBuckets are the token buckets that pace a request of cost c: the
// tokens bucket once a request's use is known (its estimate, or the use
// the reports' drop says), and Anthropic's input and output buckets for a
// request with an estimate.
func (p *pacing) tokenBuckets(c cost) []tokenBucket {
	var out []tokenBucket
	need := p.tokenUse
	if c.known() {
		need = c.in + c.out
	}
	if tk := p.report.tokens; tk.known && need > 0 {
		out = append(out, tokenBucket{tk, p.tokensUsed(), need})
	}
	e := p.estSince()
	if in := p.report.inputTokens; in.known && c.in > 0 {
		out = append(out, tokenBucket{in, e.In, c.in})
	}
	if o := p.report.outputTokens; o.known && c.out > 0 {
		out = append(out, tokenBucket{o, e.Out, c.out})
	}
	return out
}

// nextChange is the first time after now at which hold may answer
// otherwise for a request of cost c with nothing else changed: the buckets' next admissions, the
// moment the report grows older than the window, and the moment the
// oldest request the window counts leaves it. Zero when there is none.
func (p *pacing) nextChange(now time.Time, c cost) time.Time {
	if !p.has {
		return time.Time{}
	}
	var next time.Time
	soonest := func(t time.Time) {
		if t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	soonest(p.nextAdmission())
	for _, b := range p.tokenBuckets(c) {
		_, t := tokensFor(b.reading, p.report.read, now, b.used, b.need)
		soonest(t)
		soonest(tokensNext(b.reading, p.report.read, now, b.used, b.need))
	}
	if w, ok := p.window(); ok {
		soonest(p.report.sent.Add(w))
		if at, ok := p.recent.firstAfter(now.Add(-w)); ok {
			soonest(at.Add(w))
		}
	}
	return next
}

// tokensFor is what a tokens bucket, read at read as tk, takes at now
// once used more tokens have been sent: how many more requests of use
// tokens each, and t, when it holds enough for one beyond those its
// reading takes, as it refills steadily to full at its reset (as T is
// read for the requests bucket, for use tokens instead of one). The
// requests are what it holds at now (tokensHeld), refill since its
// reading included, and at least one more than its reading takes once t
// has come: without a limit, or when the refill cannot make up what is
// missing, t is the reset, and one request may go then and bring a
// fresher report.
func tokensFor(tk bucketReading, read, now time.Time, used, use int64) (int64, time.Time) {
	left := tk.remaining - used
	n := floorDiv(left, use)
	need := (n+1)*use - left // tokens missing for the next request
	t := refilled(tk, read, need)
	if now.Before(t) {
		return n, t
	}
	return max(n+1, floorDiv(tokensHeld(tk, read, now, used), use)), t
}

// tokensNext is when a tokens bucket, read at read as tk, once used more
// tokens have been sent, holds enough for one request of use tokens more
// than it holds at now: the wake of a call that its refill will let
// through, once tokensFor's t, the first such time, has passed.
func tokensNext(tk bucketReading, read, now time.Time, used, use int64) time.Time {
	held := tokensHeld(tk, read, now, used)
	return refilled(tk, read, (max(floorDiv(held, use), 0)+1)*use-(tk.remaining-used))
}

// refilled is when a tokens bucket, read at read as tk, has refilled need
// tokens since, as it refills steadily to full at its reset: rounded up,
// never early. Its reset when the refill cannot make them up, or its
// limit is not known.
func refilled(tk bucketReading, read time.Time, need int64) time.Time {
	missing := tk.limit - tk.remaining
	if tk.limit <= 0 || missing <= 0 || need >= missing {
		return read.Add(tk.reset)
	}
	// A float, as reset × need can overflow.
	return read.Add(time.Duration(math.Ceil(float64(tk.reset) * float64(need) / float64(missing))))
}

// tokensHeld is what a tokens bucket, read at read as tk, holds at now
// once used more tokens have been sent: what it held less used, and what
// it refilled since it was read. It refills steadily to full at its
// reset, so elapsed after its reading it has refilled elapsed × missing
// ÷ reset of the tokens missing from its limit, rounded down, and all of
// them once the reset has passed; nothing when its limit or reset is not
// known.
//
// The requests bucket counts no such refill, only one request once T has
// come: Breakers of a fleet without a Store each count the refill since
// a reading as their own, and for the requests bucket that nearly doubled
// the 429s of such a fleet in the fleet benchmark. Such a fleet overcounts
// the tokens' refill too, as it does the request at T; but without it, a
// deployment whose tokens refill faster than its answers bring readings
// is held to its last reading and one request more, and a pool spills
// over from it while it has room.
func tokensHeld(tk bucketReading, read, now time.Time, used int64) int64 {
	held := tk.remaining - used
	missing := tk.limit - tk.remaining
	elapsed := now.Sub(read)
	switch {
	case tk.limit <= 0 || missing <= 0 || tk.reset <= 0 || elapsed <= 0:
		return held
	case elapsed >= tk.reset:
		return held + missing
	}
	// elapsed × missing can overflow 64 bits; the quotient, less than
	// missing, cannot, and integer division rounds down, never early.
	hi, lo := bits.Mul64(uint64(elapsed), uint64(missing))
	q, _ := bits.Div64(hi, lo, uint64(tk.reset))
	return held + int64(q)
}

// floorDiv is a ÷ b rounded down, for b > 0.
func floorDiv(a, b int64) int64 {
	if a < 0 {
		return (a - b + 1) / b
	}
	return a / b
}

// window is W, the time the requests bucket takes to refill from empty,
// from the report's reset and limit; false when its pace is not known.
func (p *pacing) window() (time.Duration, bool) {
	r := p.report.requests
	missing := r.limit - r.remaining
	if !r.known || r.limit <= 0 || r.reset <= 0 || missing <= 0 {
		return 0, false
	}
	// The reset is the time to refill the missing requests; from empty,
	// the whole limit. Rounded up, and a float, as reset × limit can
	// overflow.
	w := math.Ceil(float64(r.reset) * float64(r.limit) / float64(missing))
	if w > float64(maxOpen) {
		return 0, false
	}
	return time.Duration(w), true
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
func (p *pacing) windowRoom(now time.Time) (int64, bool) {
	w, ok := p.window()
	if !ok {
		return 0, false
	}
	start := now.Add(-w)
	if start.Before(p.report.sent) {
		return 0, false
	}
	return p.report.requests.limit - int64(p.recent.countAfter(start)), true
}

// nextAdmission is T: when the freshest report says the provider admits
// the next request. A report without a reset or Retry-After does not
// say; T is then taken as come when the report was read, so that one
// request beyond R may go and bring a report that does say.
func (p *pacing) nextAdmission() time.Time {
	if t := p.report.requests.next; !t.IsZero() {
		return t
	}
	return p.report.read
}

// recent is when requests were let through, oldest first, for the
// window rule: at most maxRecent times, the older ones beyond that
// folded into a count kept with the latest of their times.
type recent struct {
	at       []time.Time
	folded   int       // admissions folded out of at
	foldedAt time.Time // the latest time among them
}

// maxRecent bounds the times recent keeps. They pile up only while a
// backend that once reported stops doing so; what is folded can only
// overstate the window's count.
const maxRecent = 1024

// add records an admission at t, the one numbered after the last.
func (r *recent) add(t time.Time) {
	if len(r.at) == maxRecent {
		half := maxRecent / 2
		r.fold(half, r.at[half-1])
		r.at = append(r.at[:0], r.at[half:]...)
	}
	if n := len(r.at); n > 0 {
		// Kept in time order, which the window's searches need: a
		// request a process let through while its store failed is added
		// when the store takes it, after later ones, and counts as let
		// through with the last, which keeps it in the window longer.
		t = later(t, r.at[n-1])
	}
	r.at = append(r.at, t)
}

// fold counts n more admissions as folded, the latest of them at t.
func (r *recent) fold(n int, t time.Time) {
	if n <= 0 {
		return
	}
	r.folded += n
	r.foldedAt = later(r.foldedAt, t)
}

// dropBefore forgets the admissions numbered up to seq, whose times a
// report sent after them never counts; admitted is the last number
// given. What was folded goes too, once every number it held is up to
// seq.
func (r *recent) dropBefore(admitted, seq uint64) {
	if len(r.at) == 0 {
		if r.folded > 0 && admitted == seq {
			*r = recent{}
		}
		return
	}
	first := admitted - uint64(len(r.at)) + 1 // the number of at[0]
	if seq < first {
		return // only folded ones are that old, and they may hold newer
	}
	n := min(int(seq-first+1), len(r.at))
	r.at = append(r.at[:0], r.at[n:]...)
	r.folded, r.foldedAt = 0, time.Time{}
}

// countAfter is how many admissions came after t.
func (r *recent) countAfter(t time.Time) int {
	i := sort.Search(len(r.at), func(i int) bool { return r.at[i].After(t) })
	n := len(r.at) - i
	if r.folded > 0 && r.foldedAt.After(t) {
		n += r.folded
	}
	return n
}

// firstAfter is the time of the first admission after t that the window
// counts.
func (r *recent) firstAfter(t time.Time) (time.Time, bool) {
	if r.folded > 0 && r.foldedAt.After(t) {
		return r.foldedAt, true
	}
	i := sort.Search(len(r.at), func(i int) bool { return r.at[i].After(t) })
	if i == len(r.at) {
		return time.Time{}, false
	}
	return r.at[i], true
}

// pace is how long the requests bucket takes to admit one more request
// by the freshest report: its reset over the requests it misses (over
// the limit when full); a second when the report does not say.
func (p *pacing) pace() time.Duration {
	r := p.report.requests
	if !p.has || !r.known || r.reset <= 0 || r.limit <= 0 {
		return time.Second
	}
	return max(r.reset/time.Duration(max(r.limit-r.remaining, 1)), time.Millisecond)
}

// headroom is the share of the provider's buckets left at now by the
// freshest report, once the requests let through since are counted: of
// the requests bucket (R − S, with the next admission and the window's
// reading as room counts them), the tokens bucket (what it holds at now
// by tokensHeld, its refill since the reading included, less the use of
// each request let through), and Anthropic's input and output buckets
// (likewise); the least of those the report stated a limit for, in
// [0, 1].
// It is 1 when nothing is known: a deployment that has not reported
// stands as full.
func (p *pacing) headroom(now time.Time) float64 {
	h := 1.0
	if !p.has {
		return h
	}
	share := func(left, limit int64) {
		if limit > 0 {
			h = min(h, max(float64(left)/float64(limit), 0))
		}
	}
	s := p.sentSince()
	if r := p.report.requests; r.known {
		left := r.remaining - s
		if !now.Before(p.nextAdmission()) {
			left++
		}
		if w, ok := p.windowRoom(now); ok {
			left = max(left, w)
		}
		share(left, r.limit)
	}
	e, read := p.estSince(), p.report.read
	if tk := p.report.tokens; tk.known {
		share(tokensHeld(tk, read, now, p.tokensUsed()), tk.limit)
	}
	if in := p.report.inputTokens; in.known {
		share(tokensHeld(in, read, now, e.In), in.limit)
	}
	if o := p.report.outputTokens; o.known {
		share(tokensHeld(o, read, now, e.Out), o.limit)
	}
	return h
}
