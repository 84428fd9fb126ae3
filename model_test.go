package llmretry_test

import (
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/llmretry/llmretry"
)

// This file is a model of Chain.Do written from the package documentation
// (doc.go and the exported doc comments), not from chain.go: given a draw,
// it predicts every record, the error, its cause and advice, and when Do
// returns, in virtual time. Where the documentation left a point open,
// the model follows what Do does and says so in a comment marked
// AMBIGUOUS; the points marked SETTLED were open when the model was
// written, and the docs now say what Do does. Where Do breaks a promise
// the docs make, the model keeps the promise and the draw fails.

// model is the state of one draw's prediction.
type model struct {
	d        *draw
	l        errLabels
	got      []propOutcome // only for the jittered waits Do drew (and to index them)
	top      *mchain
	problems []string
	tie      string // also set, to stop the model, when it runs away
	runaway  bool   // the model made more than maxRecords records in a call
}

// mchain is the state of one chain across its calls: the draw's chain, or
// an inner chain (which has one call).
type mchain struct {
	backends []drawBackend
	next     []int // each backend's position in its script
	br       []*mbreaker
	maxRaw   int // Chain.MaxRawText
}

type mbreaker struct {
	failures int           // the configured count, defaults applied
	cooldown time.Duration // defaults applied
	count    int           // consecutive retryable failures
	open     bool
	until    time.Duration
	kind     llmretry.Kind
	hinted   bool // a retry-after hint set until: a waiting call may wait it out
	probing  bool // a probe is in flight
	// opened counts the times it "went from closed or half-open to
	// open" (BreakerState.Opened): a hint that extends a breaker still
	// open does not count.
	opened int
}

// state is what Breaker.State should read: "a breaker past its open
// period is still Open until a probe answers, with Until in the past";
// Kind is "KindUnknown when closed". No probe is in flight between calls:
// the calls of a draw run one after another, and every attempt has
// answered when Do returns.
func (br *mbreaker) state() *brState {
	if br == nil {
		return nil
	}
	if !br.open {
		return &brState{Failures: br.count, Opened: br.opened}
	}
	return &brState{Open: true, Until: br.until, Failures: br.count, Kind: br.kind, Opened: br.opened}
}

// mcall is the state of one call.
type mcall struct {
	m         *model
	ch        *mchain
	ci        int
	hook      time.Duration // how long OnAttempt takes
	obs       []rec         // what Do's OnAttempt saw, for the waits it drew
	nested    bool          // runs under another chain's retrying attempt
	encl      *upAttempt    // the enclosing attempt; nil at the top
	alone     bool          // runs under Standalone: its Delivered does not mark encl
	depth     int           // 0 for the draw's chain, 1 for an inner one
	start     time.Duration
	now       time.Duration
	cancelAt  time.Duration // forever when none
	cancelBy  string        // the label of context.Cause after the cancel
	deadAt    time.Duration // forever when none
	deadBy    string
	deadCause string // TimedOut.Cause's label when the deadline passed; "" when nil
	hasDead   bool
	out       propOutcome
	tries     []int           // requests (and skips) made to each backend so far
	lastKind  []rec           // each backend's last record in this call
	visited   []bool          // whether each backend has a record in this call
	firstAt   []time.Duration // the Start of each backend's first record in this call
	skipped   []int           // backends skipped for their breaker and not yet come back to
	cameBack  []bool          // backends the call has come back to
	chosen    bool            // the come-backs were chosen, when the first pass ended
}

func predict(d *draw, got []propOutcome) ([]propOutcome, []string, string) {
	m := &model{d: d, l: d.labels(), got: got}
	m.top = &mchain{backends: d.backends, next: make([]int, len(d.backends)), maxRaw: d.maxRaw}
	for _, b := range d.backends {
		if b.breaker == nil {
			m.top.br = append(m.top.br, nil)
			continue
		}
		mb := &mbreaker{failures: b.breaker.failures, cooldown: b.breaker.cooldown}
		if mb.failures == 0 {
			mb.failures = llmretry.DefaultBreakerFailures
		}
		if mb.cooldown == 0 {
			mb.cooldown = llmretry.DefaultCooldown
		}
		m.top.br = append(m.top.br, mb)
	}
	var outs []propOutcome
	var end time.Duration
	for ci, c := range d.calls {
		mc := &mcall{m: m, ch: m.top, ci: ci, start: end + c.gap, hook: c.hook}
		if ci < len(got) {
			mc.obs = got[ci].Hooks
		}
		mc.run(c)
		if m.runaway {
			// A model that loops is a bug in the model, not a tie: the
			// draw fails, with what the model predicted so far.
			return append(outs, mc.out), m.problems, ""
		}
		if m.tie != "" {
			return nil, nil, m.tie
		}
		for _, br := range m.top.br {
			mc.out.Breakers = append(mc.out.Breakers, br.state())
		}
		end = mc.now
		outs = append(outs, mc.out)
	}
	return outs, m.problems, ""
}

func (m *model) problemf(format string, args ...any) {
	m.problems = append(m.problems, fmt.Sprintf(format, args...))
}

// apart records a tie when two independent events coincide.
func (m *model) apart(a, b time.Duration, what string) {
	if a == b && a != forever && m.tie == "" {
		m.tie = fmt.Sprintf("%s at %v", what, a)
	}
}

func minDur(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

func (mc *mcall) run(c drawCall) {
	m := mc.m
	mc.cancelAt, mc.deadAt = forever, forever
	mc.cancelBy, mc.deadBy = "context.Canceled", "context.DeadlineExceeded"
	if c.cancelErr != nil {
		mc.cancelBy = m.l.of(c.cancelErr)
	}
	if c.deadlineErr != nil {
		mc.deadBy = m.l.of(c.deadlineErr)
		mc.deadCause = mc.deadBy
	}
	if c.cancel != 0 {
		mc.cancelAt = mc.start + c.cancel
		if c.cancel < 0 {
			mc.cancelAt = mc.start
		}
	}
	if c.deadline != 0 {
		mc.hasDead = true
		mc.deadAt = mc.start + c.deadline
	}
	// A cancel and a deadline at the same instant race: either may end
	// the call first, and the draw cannot say which.
	m.apart(mc.cancelAt, mc.deadAt, "the caller's cancel and deadline")
	mc.play()
}

// play runs the call once its context's ends are set.
func (mc *mcall) play() {
	m := mc.m
	n := len(mc.ch.backends)
	mc.now = mc.start
	mc.tries = make([]int, n)
	mc.lastKind = make([]rec, n)
	mc.visited = make([]bool, n)
	mc.firstAt = make([]time.Duration, n)
	mc.cameBack = make([]bool, n)
	mc.out.RetryItem = true

	// The context is checked before every attempt: one done before Do
	// began ends it with no attempt at all.
	if mc.cancelAt <= mc.now && mc.cancelAt < mc.deadAt {
		mc.cancelled(mc.cancelBy)
		return
	}
	if mc.deadAt <= mc.now {
		mc.exhaust()
		return
	}

	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	for pos := 0; pos < len(order); pos++ {
		if m.tie != "" {
			return
		}
		if done := mc.backend(order[pos], pos >= n, pos == len(order)-1); done {
			return
		}
		if pos == len(order)-1 {
			r := mc.out.Hooks[len(mc.out.Hooks)-1]
			order = append(order, mc.comeBacks(r.Backend, r.Kind, r.Skipped, true)...)
		}
	}
	// Every backend has failed (the last record said stop).
	mc.exhaust()
}

// comeBacks lists, in chain order, the backends skipped for their breaker
// that the call comes back to when backend cur gives up with Kind k (or is
// skipped, when curSkipped): those after which every backend failed for a
// reason about the request. With commit, it also marks them as come back
// to, since the call comes back to each at most once.
//
// SETTLED: Backend.Breaker says a skipped backend is come back to "when every
// backend after it failed for a reason about the request", that a backend
// skipped too does not count against it, that a skipped last backend ends
// the call, and that the call comes back to every such backend in chain
// order, at most once each.
func (mc *mcall) comeBacks(cur int, k llmretry.Kind, curSkipped, commit bool) []int {
	// "The backends to come back to are chosen once, when the call has
	// been through the whole chain" (Backend.Breaker).
	if mc.chosen || curSkipped || !aboutRequest(k) {
		return nil
	}
	var back, keep []int
	for _, s := range mc.skipped {
		if mc.aboutRequestAfter(s, cur, k) {
			back = append(back, s)
		} else {
			keep = append(keep, s)
		}
	}
	slices.Sort(back)
	if commit {
		mc.chosen = true
		mc.skipped = keep
		for _, s := range back {
			mc.cameBack[s] = true
		}
	}
	return back
}

// aboutRequestAfter reports whether every backend after s that was not
// skipped failed for a reason about the request, taking backend cur's
// latest record to have Kind k.
func (mc *mcall) aboutRequestAfter(s, cur int, k llmretry.Kind) bool {
	for j := s + 1; j < len(mc.ch.backends); j++ {
		r := mc.lastKind[j]
		if j == cur {
			r.Kind, r.Skipped, r.Why = k, false, ""
		} else if !mc.visited[j] {
			return false
		}
		if r.Skipped {
			continue
		}
		if !aboutRequest(r.Kind) {
			return false
		}
	}
	return true
}

// aboutRequest reports whether a failure of Kind k is about the request
// rather than the backend's health. Doc.go lists truncated, rejected,
// parse and unknown; a Kind outside the constants, which a custom
// Classify may return, is settled by Breaker's doc: failures other than
// transient or timeout "are about the request, not the backend's health"
// (cancelled never gets this far: it ends the call).
func aboutRequest(k llmretry.Kind) bool {
	switch k {
	case llmretry.KindTransient, llmretry.KindTimeout, llmretry.KindCancelled:
		return false
	}
	return true
}

// isLast reports whether backend b is the last the call can try, given
// that it gives up with Kind k (or is skipped).
func (mc *mcall) isLast(b int, final bool, k llmretry.Kind, skipped bool) bool {
	return final && len(mc.comeBacks(b, k, skipped, false)) == 0
}

// skip marks b as skipped for its breaker, to come back to.
func (mc *mcall) skip(b int) {
	if !mc.cameBack[b] && !slices.Contains(mc.skipped, b) {
		mc.skipped = append(mc.skipped, b)
	}
}

func (mc *mcall) reserve(p llmretry.Policy) (time.Duration, bool) {
	switch {
	case p.Reserve > 0:
		return p.Reserve, true
	case p.Reserve < 0:
		return 0, false
	}
	had := mc.deadAt - mc.start
	return minDur(llmretry.DefaultReserve, had/2), true
}

func capOf(p llmretry.Policy) (time.Duration, bool) {
	switch {
	case p.MaxWait > 0:
		return p.MaxWait, true
	case p.MaxWait < 0:
		return 0, false
	}
	return llmretry.DefaultMaxWait, true
}

// fits reports whether a wait of w from now passes the deadline check: it
// ends before the deadline and leaves the reserve.
func (mc *mcall) fits(p llmretry.Policy, w time.Duration) bool {
	if !mc.hasDead {
		return true
	}
	end := mc.now + w
	res, has := mc.reserve(p)
	if !has {
		// SETTLED: with a negative Reserve a wait "must still end before
		// the deadline"; WhyReserve now says "at or past the deadline",
		// so one that ends at the deadline itself is refused.
		return end < mc.deadAt
	}
	// "Leave less than the reserve" fails: exactly the reserve fits.
	return mc.deadAt-end >= res
}

// hookIndex is the index the next OnAttempt record will have.
func (mc *mcall) hookIndex() int { return len(mc.out.Hooks) }

// observed returns Do's record at the model's next hook index, if any.
func (mc *mcall) observed() (rec, bool) {
	i := mc.hookIndex()
	if i < len(mc.obs) {
		return mc.obs[i], true
	}
	return rec{}, false
}

func (mc *mcall) emit(r rec) {
	if len(mc.out.Hooks) > maxRecords && mc.m.tie == "" {
		mc.m.tie, mc.m.runaway = "model runaway", true
		mc.m.problemf("model runaway: more than %d records in call %d", maxRecords, mc.ci)
	}
	mc.out.Hooks = append(mc.out.Hooks, r)
	mc.out.Attempts = append(mc.out.Attempts, r)
	if r.Backend >= 0 {
		if !mc.visited[r.Backend] {
			mc.firstAt[r.Backend] = r.Start
		}
		mc.lastKind[r.Backend] = r
		mc.visited[r.Backend] = true
	}
	mc.afterHook()
}

// afterHook lets OnAttempt's time pass.
func (mc *mcall) afterHook() {
	hook := mc.hook
	if hook == 0 {
		return
	}
	end := mc.now + hook
	mc.m.apart(end, mc.cancelAt, "hook end and cancel")
	mc.m.apart(end, mc.deadAt, "hook end and deadline")
	mc.now = end
}

// backend runs the attempts of one backend; it reports whether Do returned.
func (mc *mcall) backend(b int, revisit, final bool) bool {
	m := mc.m
	db := mc.ch.backends[b]
	p := db.policy
	br := mc.ch.br[b]
	if revisit && mc.lastKind[b].Skipped {
		// "A skip has the Try its request would have had" (Attempt.Try):
		// it sent nothing, so the come-back's request has that Try. A
		// backend come back to after sending goes on with its tries and
		// waits ("going on with their tries and waits where they left
		// them", Backend.Breaker).
		mc.tries[b]--
	}
	for mc.m.tie == "" {
		mc.tries[b]++
		try := mc.tries[b]
		model := db.model
		if model == "" {
			model = "unknown"
		}
		base := rec{Backend: b, Model: model, Try: try, Start: mc.now, Raw: "<nil>"}

		// The context is checked before every attempt; only a slow
		// OnAttempt can let it end between attempts.
		// The record before then says what actually happened: Do
		// stopped, for the caller's sake.
		if mc.cancelAt <= mc.now && mc.cancelAt < mc.deadAt {
			mc.cutWait(llmretry.WhyCancelled)
			mc.cancelled(mc.cancelBy)
			return true
		}
		if mc.deadAt <= mc.now {
			mc.cutWait(llmretry.WhyDeadline)
			mc.exhaust()
			return true
		}

		probe := false
		if br != nil && br.open {
			// Not a tie to avoid: a retry after a retry-after hint on a
			// backend with a breaker is due exactly when the breaker
			// half-opens, and the docs say that caller then comes back.
			if mc.now < br.until || br.probing {
				// Half-open with a probe in flight (only an inner chain
				// sharing its enclosing attempt's breaker sees one), the
				// skip's RetryAfter, "the time until the breaker
				// half-opened", is none.
				wait := max(br.until-mc.now, 0)
				r := base
				r.Skipped, r.Kind, r.RetryAfter, r.Why = true, br.kind, wait, llmretry.WhyBreaker
				if mc.nested {
					// A nested chain "makes one attempt per backend
					// and never waits": not for a breaker either.
					r.Next = llmretry.NextFailOver
					if mc.isLast(b, final, br.kind, true) {
						r.Next = llmretry.NextStop
					} else {
						mc.skip(b)
					}
					mc.emit(r)
					return false
				}
				if !mc.isLast(b, final, br.kind, true) {
					// Skip it, and come back to it when every later
					// backend fails for a reason about the request.
					r.Next = llmretry.NextFailOver
					mc.emit(r)
					mc.skip(b)
					return false
				}
				// The last backend it can try: wait for it, as for a
				// retry-after, if the wait passes the same checks.
				ok := true
				if c, has := capOf(p); has && wait > c {
					ok = false
				}
				if ok && !mc.fits(p, wait) {
					ok = false
				}
				// Backend.Breaker: "never longer than it would have spent
				// retrying the backend without one", unless a hint opened
				// it.
				// Its time on the backend counts from when the call
				// first came to it.
				came := mc.now
				if mc.visited[b] {
					came = mc.firstAt[b]
				}
				if u, bounded := unusedWaits(p, 1, mc.hasDead); ok && !br.hinted && bounded && mc.now+wait > came+u {
					ok = false
				}
				if !ok {
					r.Next = llmretry.NextStop
					mc.emit(r)
					return false
				}
				// A wait that ends is recorded when it ends, as a skip
				// with Next retry and RetryIn the time waited (Attempt.
				// Skipped); the probe follows at once. One cut short
				// records the skip then, with what ended it and the time
				// still left from then, spanning the wait in vain.
				end := mc.now + wait
				m.apart(end, mc.cancelAt, "breaker wait end and cancel")
				if mc.cancelAt < end {
					r.Start, r.Elapsed = mc.now, mc.cancelAt-mc.now
					mc.now = mc.cancelAt
					r.RetryAfter = end - mc.now
					r.Next, r.Why = llmretry.NextStop, llmretry.WhyCancelled
					mc.emit(r)
					mc.cancelled(mc.cancelBy)
					return true
				}
				mc.now = end
				r.Next, r.Why, r.RetryIn = llmretry.NextRetry, "", wait
				mc.emit(r)
				base.Start = mc.now
				// The context is checked again once OnAttempt returns:
				// nothing is sent after a cancel or the deadline.
				if mc.cancelAt <= mc.now && mc.cancelAt < mc.deadAt {
					mc.cutWait(llmretry.WhyCancelled)
					mc.cancelled(mc.cancelBy)
					return true
				}
				if mc.deadAt <= mc.now {
					mc.cutWait(llmretry.WhyDeadline)
					mc.exhaust()
					return true
				}
			}
			probe = true
		}

		if br != nil {
			br.probing = probe
		}
		res := mc.attempt(b)
		if br != nil {
			br.probing = false
		}
		if m.tie != "" {
			return true
		}
		r := base
		r.Elapsed = res.ret - mc.now
		r.Delivered = res.delivered
		mc.now = res.ret
		if res.ok {
			// SETTLED: a Call that ignores its context and answers
			// after the caller's cancel or deadline: "Do returns it"
			// (Backend.Call). Its breaker, as for any attempt the
			// caller's context overtook, learns nothing from it.
			if res.callerEnd != "" {
				br = nil
			}
			mc.emitSuccess(r, res.resp, br)
			return true
		}
		r.Err = res.err
		r.Kind, r.Status, r.RetryAfter = res.kind, res.status, res.hint
		if res.raw != nil {
			r.Raw = capRaw(*res.raw, mc.ch.maxRaw)
		}

		// A breaker learns from every attempt the caller did not end.
		if br != nil && res.callerEnd == "" {
			br.observe(mc.now, r.Kind, r.RetryAfter, probe, p)
		}

		switch {
		case res.callerEnd == "cancel":
			r.Next, r.Why = llmretry.NextStop, llmretry.WhyCancelled
			mc.emit(r)
			mc.cancelled(mc.cancelBy)
			return true
		case res.callerEnd == "deadline":
			r.Next, r.Why = llmretry.NextStop, llmretry.WhyDeadline
			mc.emit(r)
			mc.exhaust()
			return true
		case r.Kind == llmretry.KindCancelled:
			// The backend reported the withdrawal: its own error is
			// the cause.
			r.Next, r.Why = llmretry.NextStop, llmretry.WhyCancelled
			mc.emit(r)
			mc.cancelled(res.err)
			return true
		case r.Delivered:
			r.Next, r.Why = llmretry.NextStop, llmretry.WhyDelivered
			mc.emit(r)
			mc.exhaust()
			return true
		case r.Kind == llmretry.KindRefused:
			// "By default it ends the chain with the provider's reason
			// rather than failing over."
			r.Next, r.Why = llmretry.NextStop, llmretry.WhyRefused
			mc.emit(r)
			mc.exhaust()
			return true
		}

		last := mc.isLast(b, final, r.Kind, false)
		giveUp := func(why llmretry.Why) bool {
			r.Why = why
			if why == llmretry.WhyBreaker {
				// Failing over because the breaker would still be
				// open when the wait ended is a skip of the retry:
				// the call comes back as it does to a skipped one.
				mc.skip(b)
				last = mc.isLast(b, final, r.Kind, true)
			}
			r.Next = llmretry.NextFailOver
			if last {
				r.Next = llmretry.NextStop
			}
			mc.emit(r)
			if last {
				mc.exhaust()
			}
			return last
		}
		if !r.Kind.Retryable() {
			return giveUp(llmretry.WhyNotRetryable)
		}
		if mc.nested {
			// "Makes one attempt per backend and never waits", Why
			// "nested". AMBIGUOUS: the docs do not order nested among
			// waits_used and max_wait; a nested backend with no waits of
			// its own, or a hint past its MaxWait, reads nested, as Do
			// has it (and as the model first guessed).
			return giveUp(llmretry.WhyNested)
		}
		if p.FailOverSilent && r.Kind == llmretry.KindTimeout && !res.delivered && !last {
			// Policy.FailOverSilent: "an attempt that timed out before
			// any output ... fail[s] over to the next backend at once";
			// "on the last backend the call can try it changes nothing".
			// The model's backends make no output but Delivered, which
			// stops the call before this.
			return giveUp(llmretry.WhySilent)
		}
		w, repeat, why := nextWait(p, try, mc.hasDead)
		if why != "" {
			return giveUp(why)
		}
		if c, has := capOf(p); has && r.RetryAfter > c {
			return giveUp(llmretry.WhyMaxWait)
		}
		lo, hi := w, w
		if p.Jitter > 0 {
			lo = time.Duration(float64(w) * (1 - p.Jitter))
			if repeat && lo < time.Second {
				lo = time.Second
			}
		}
		if br != nil && r.RetryAfter > 0 {
			// On a backend with a Breaker the hint is the wait itself.
			lo, hi = r.RetryAfter, r.RetryAfter
		} else {
			lo, hi = max(lo, r.RetryAfter), max(hi, r.RetryAfter)
		}
		// Checks on the drawn wait, in the order Do applies them.
		check := func(in time.Duration) llmretry.Why {
			if !mc.fits(p, in) {
				return llmretry.WhyReserve
			}
			// Only a backend the call can fail over from gives up
			// when its breaker would still be open after the wait; the
			// last one waits, and then waits for the breaker as a
			// skip.
			if br != nil && br.open && !last {
				if br.until > mc.now+in {
					return llmretry.WhyBreaker
				}
			}
			return ""
		}
		var in time.Duration
		whyHi, whyLo := check(hi), check(lo)
		switch {
		case whyHi == "" && whyLo == "":
			in = mc.jittered(lo, hi)
		case whyHi == whyLo:
			return giveUp(whyHi)
		default:
			// Whether the drawn wait passes depends on the draw: take
			// Do's, and check it.
			o, ok := mc.observed()
			if !ok || o.Next != llmretry.NextRetry {
				if ok && (o.Why == whyHi || o.Why == whyLo) {
					return giveUp(o.Why)
				}
				return giveUp(whyHi)
			}
			in = mc.jittered(lo, hi)
			if w := check(in); w != "" {
				m.problemf("call %d record %d: retry_in %v fails the %s check", mc.ci, mc.hookIndex(), in, w)
			}
		}
		r.Next, r.RetryIn = llmretry.NextRetry, in
		decided := mc.now
		mc.emit(r)
		// Chain.OnAttempt: the wait is measured from the decision, so a
		// slow hook's time is part of it; only the caller's cancel or
		// deadline cuts it short, and the record in the error (not the
		// one the hook saw) then says stop.
		if mc.deadAt <= mc.now && mc.deadAt < mc.cancelAt {
			mc.cutWait(llmretry.WhyDeadline)
			mc.exhaust()
			return true
		}
		if mc.sleep(max(decided+in-mc.now, 0)) {
			return true
		}
	}
	return true
}

// jittered returns the wait Do drew for the next record, checked against
// [lo, hi]; without jitter the two are equal and that is the wait.
func (mc *mcall) jittered(lo, hi time.Duration) time.Duration {
	if lo == hi {
		return hi
	}
	o, ok := mc.observed()
	if !ok || o.Next != llmretry.NextRetry {
		// Do did not retry here; the comparison will show it. Predict
		// the longest wait.
		return hi
	}
	if o.RetryIn < lo || o.RetryIn > hi {
		mc.m.problemf("call %d record %d: retry_in %v outside [%v, %v]", mc.ci, mc.hookIndex(), o.RetryIn, lo, hi)
	}
	return o.RetryIn
}

// nextWait is the policy's wait before retry number try (the try-th
// retry, after attempt number try), or why there is none.
func nextWait(p llmretry.Policy, try int, hasDeadline bool) (w time.Duration, repeat bool, why llmretry.Why) {
	n := len(p.Waits)
	switch {
	case n == 0:
		return 0, false, llmretry.WhyWaitsUsed
	case p.MaxTries > 0 && try >= p.MaxTries:
		// Policy.MaxTries: "a call that has sent MaxTries gives up on
		// it with Why waits_used".
		return 0, false, llmretry.WhyWaitsUsed
	case try <= n:
		return p.Waits[try-1], false, ""
	case !hasDeadline:
		return 0, false, llmretry.WhyWaitsUsed
	case p.Waits[n-1] == 0:
		return 0, false, llmretry.WhyWaitsUsed
	}
	return max(p.Waits[n-1], time.Second), true, ""
}

// unusedWaits is what Backend.Breaker bounds a wait for a breaker by: the
// waits of p not used yet, from try number try on ("a last wait that
// repeats under a deadline counts as often as MaxTries allows, and once
// without it"). Summed from nextWait, the rule the retries follow,
// without jitter.
func unusedWaits(p llmretry.Policy, try int, hasDeadline bool) (time.Duration, bool) {
	var d time.Duration
	for t := try; ; t++ {
		w, repeat, why := nextWait(p, t, hasDeadline)
		if why != "" {
			return d, true
		}
		if repeat && p.MaxTries == 0 {
			return d, true
		}
		d += w
	}
}

// sleep waits d from now; a cancel during the wait ends Do at once, and the
// record of the attempt before the wait then reads stop, cancelled. It
// reports whether Do returned.
func (mc *mcall) sleep(d time.Duration) bool {
	end := mc.now + d
	mc.m.apart(end, mc.cancelAt, "wait end and cancel")
	mc.m.apart(end, mc.deadAt, "wait end and deadline")
	switch {
	case mc.cancelAt < end:
		// A cancel during a slow OnAttempt ends the wait as it starts.
		mc.now = max(mc.now, mc.cancelAt)
		mc.cutWait(llmretry.WhyCancelled)
		mc.cancelled(mc.cancelBy)
		return true
	case mc.deadAt < end:
		mc.now = mc.deadAt
		mc.cutWait(llmretry.WhyDeadline)
		mc.exhaust()
		return true
	}
	mc.now = end
	return false
}

func (mc *mcall) cutWait(why llmretry.Why) {
	if len(mc.out.Attempts) == 0 {
		return
	}
	r := &mc.out.Attempts[len(mc.out.Attempts)-1]
	r.Next, r.Why, r.RetryIn = llmretry.NextStop, why, 0
}

func (mc *mcall) emitSuccess(r rec, resp string, br *mbreaker) {
	if br != nil {
		br.count, br.open = 0, false
	}
	mc.out.Hooks = append(mc.out.Hooks, r)
	mc.afterHook()
	mc.out.Attempts = nil
	mc.out.Resp, mc.out.ErrType = resp, "nil"
	mc.out.RetryItem = false
	mc.out.End = mc.now
}

func (br *mbreaker) observe(now time.Duration, k llmretry.Kind, hint time.Duration, probe bool, p llmretry.Policy) {
	if k == llmretry.KindCancelled {
		// A withdrawal, even one the backend reported, says nothing
		// about the backend's health: not counted, as the caller's own
		// cancel is not.
		return
	}
	if k != llmretry.KindTransient && k != llmretry.KindTimeout {
		// SETTLED: of a probe's outcomes, "any other outcome closes it,
		// a refusal of the request included: the backend is up" (Breaker).
		if probe {
			br.open, br.count = false, 0
		}
		return
	}
	br.count++
	switch {
	case hint > 0:
		d := hint
		if c, has := capOf(p); has && d > c {
			d = c
		}
		br.openFor(now, d, k, true)
	case br.count >= br.failures || probe:
		br.openFor(now, br.cooldown, k, false)
	}
}

// openFor opens the breaker for d from now. Only a closed or half-open
// breaker (past its open period, waiting for a probe) opening counts in
// Opened. A breaker still open is reached only by an attempt that was in
// flight when an inner chain sharing the breaker opened it. AMBIGUOUS:
// the docs do not say whether a failure then shortens the open period, or
// changes its Kind; the model takes the later end, and the Kind that goes
// with it, as Do does.
//
// The hint-opened mark goes with the open period: Backend.Breaker lets a
// call wait out a breaker "that a retry-after hint opened".
func (br *mbreaker) openFor(now, d time.Duration, k llmretry.Kind, hinted bool) {
	if !br.open || now >= br.until {
		br.opened++
	} else if now+d <= br.until {
		return
	}
	br.open, br.until, br.kind, br.hinted = true, now+d, k, hinted
}

// cancelled ends the call with a *Cancelled.
func (mc *mcall) cancelled(cause string) {
	mc.out.ErrType, mc.out.Cause, mc.out.RetryItem = "*Cancelled", cause, true
	mc.out.End = mc.now
}

// exhaust ends the call with the error Exhaust chooses.
func (mc *mcall) exhaust() {
	mc.out.End = mc.now
	trunc, timeout := false, false
	allRefused := len(mc.out.Attempts) > 0
	for _, r := range mc.out.Attempts {
		if r.Kind != llmretry.KindRejected && r.Kind != llmretry.KindTruncated && r.Kind != llmretry.KindRefused {
			allRefused = false
		}
		if r.Skipped {
			continue
		}
		trunc = trunc || r.Kind == llmretry.KindTruncated
		timeout = timeout || r.Kind == llmretry.KindTimeout
	}
	// AMBIGUOUS: Do's doc says "when ctx's deadline passes, Do stops and
	// returns a *TimedOut", Exhaust's that the type follows from the
	// records. When the deadline passes during the last OnAttempt, after
	// Do has decided to stop for another reason, Do keeps the type (and
	// the cause) that the records give; the deadline counts only when it
	// is what stopped Do.
	deadlinePassed := mc.hasDead && mc.deadAt <= mc.now
	if n := len(mc.out.Attempts); n > 0 {
		deadlinePassed = mc.out.Attempts[n-1].Why == llmretry.WhyDeadline
	}
	switch {
	case trunc:
		// Truncated's ItemRetryAfter is 0: no time to wait for.
		mc.out.ErrType, mc.out.RetryItem = "*Truncated", false
		return
	case timeout || deadlinePassed:
		mc.out.ErrType, mc.out.RetryItem = "*TimedOut", true
		if deadlinePassed && mc.deadCause != "" {
			mc.out.Cause = mc.deadCause
		}
	default:
		stoppedRefused := len(mc.out.Attempts) > 0 && mc.out.Attempts[len(mc.out.Attempts)-1].Why == llmretry.WhyRefused
		mc.out.ErrType, mc.out.RetryItem = "*Exhausted", !allRefused && !stoppedRefused
	}
	mc.out.RetryAfter = mc.retryItemAfter()
	mc.out.RetryAfterOK = mc.out.RetryAfter > 0
}

// retryItemAfter is the advice of an Exhausted or TimedOut as Do returns
// (Exhausted.ItemRetryAfter): "when
// every backend's last attempt carried a retry-after hint (or was skipped
// by a breaker that half-opens at a known time), the time from now until
// the soonest of them"; "0 when a backend gave no hint or the moment has
// passed". A hint runs out its length after its attempt ended; a skip's
// RetryAfter is the time from the skip until the breaker half-opens.
//
// AMBIGUOUS: "every backend" can only be the backends that have records:
// the error does not know the chain. A backend the call never reached
// does not take the advice away.
func (mc *mcall) retryItemAfter() time.Duration {
	last := map[int]rec{}
	for _, r := range mc.out.Attempts {
		last[r.Backend] = r
	}
	soonest := forever
	for _, r := range last {
		if r.RetryAfter <= 0 {
			return 0
		}
		soonest = minDur(soonest, r.Start+r.Elapsed+r.RetryAfter)
	}
	if soonest == forever || soonest <= mc.now {
		return 0
	}
	return soonest - mc.now
}

// result is how one attempt ended.
type result struct {
	ret       time.Duration
	ok        bool
	resp      string
	err       string
	kind      llmretry.Kind
	status    int
	hint      time.Duration
	raw       *string
	delivered bool
	callerEnd string // "cancel" or "deadline" when the caller's context was done when the Call returned
}

// attempt plays backend b's next scripted pstep from now.
func (mc *mcall) attempt(b int) result {
	m := mc.m
	db := mc.ch.backends[b]
	i := mc.ch.next[b]
	mc.ch.next[b]++
	s := pstep{ok: true, label: db.defaultResp, honour: true, dur: 0}
	if i < len(db.script) {
		s = db.script[i]
	}
	start := mc.now
	natural := forever
	if s.dur != forever {
		natural = start + s.dur
	}
	timeoutAt, stallAt := forever, forever
	if db.timeout > 0 {
		timeoutAt = start + db.timeout
	}
	if db.stallTimeout > 0 {
		stallAt = start + db.stallTimeout
	}
	if s.nest != nil {
		return mc.nestAttempt(db, mc.ch.br[b], s.nest, timeoutAt, stallAt)
	}
	var res result
	ctxDone, by := false, ""
	di := 0
	for {
		// The earliest end of the attempt's context.
		ends := []struct {
			at time.Duration
			by string
		}{{timeoutAt, "timeout"}, {stallAt, "stall"}, {mc.cancelAt, "cancel"}, {mc.deadAt, "deadline"}}
		ce, cby := forever, ""
		for _, e := range ends {
			if e.at < ce {
				ce, cby = e.at, e.by
			}
		}
		for _, e := range ends {
			if e.by != cby {
				m.apart(e.at, ce, "two ends of an attempt's context")
			}
		}
		if ctxDone {
			ce = forever
		}
		nd := forever
		if di < len(s.delivers) {
			nd = start + s.delivers[di]
		}
		m.apart(nd, ce, "delivery and the end of the attempt's context")
		m.apart(natural, ce, "a call's return and the end of its context")
		if nd < ce && nd < natural {
			if !ctxDone {
				res.delivered = true
				if db.stallTimeout > 0 {
					stallAt = nd + db.stallTimeout
				}
				mc.deliveredUp(nd)
			}
			di++
			continue
		}
		if ce < natural {
			ctxDone, by = true, cby
			if s.honour {
				res.ret = ce
				break
			}
			continue
		}
		res.ret = natural
		break
	}
	if res.ret == forever {
		m.tie = "a call that never returns"
		return res
	}
	// A Call returning at the very instant the caller's context ends
	// (other than because it ended) races the context's timer.
	if !(s.honour && ctxDone && by == "cancel") {
		m.apart(res.ret, mc.cancelAt, "a call's return and the caller's cancel")
	}
	if !(s.honour && ctxDone && by == "deadline") {
		m.apart(res.ret, mc.deadAt, "a call's return and the caller's deadline")
	}
	// The caller's context at the moment the Call returned.
	switch {
	case mc.cancelAt <= res.ret && mc.cancelAt < mc.deadAt:
		res.callerEnd = "cancel"
	case mc.deadAt <= res.ret:
		res.callerEnd = "deadline"
	}
	honourEnded := s.honour && ctxDone
	if honourEnded {
		res.err = mc.ctxReturnLabel(s, by)
	} else if s.ok {
		res.ok, res.resp = true, s.label
		return res
	} else {
		res.err = m.l.of(s.err)
		res.status, res.hint, res.raw = s.status, s.hint, s.raw
	}
	switch {
	case res.callerEnd == "cancel":
		res.kind = llmretry.KindCancelled
	case res.callerEnd == "deadline":
		res.kind = llmretry.KindTimeout
	case ctxDone:
		// Ended by the backend's own Timeout or StallTimeout.
		res.kind = llmretry.KindTimeout
	case honourEnded:
		res.kind = llmretry.KindTimeout
	default:
		res.kind = s.kind
	}
	return res
}

// ctxReturnLabel is the label of what an honouring Call returns when its
// context ends by by.
func (mc *mcall) ctxReturnLabel(s pstep, by string) string {
	var errLabel, cause string
	switch by {
	case "cancel":
		errLabel, cause = "context.Canceled", mc.cancelBy
	case "deadline":
		errLabel, cause = "context.DeadlineExceeded", mc.deadBy
	case "timeout":
		errLabel, cause = "context.DeadlineExceeded", "ErrAttemptTimeout"
	case "stall":
		// SETTLED: a stalled attempt's context "is then cancelled with
		// the cause ErrStalled: its Err is context.Canceled"
		// (Backend.StallTimeout).
		errLabel, cause = "context.Canceled", "ErrStalled"
	}
	if s.cause {
		return "ctxreturn(" + cause + ")"
	}
	return errLabel
}

// upAttempt is the enclosing chain's attempt as an inner chain sees it.
type upAttempt struct {
	chain        *mcall // the chain whose attempt it is
	delivered    bool
	stallAt      time.Duration // when its StallTimeout ends it; forever when none
	stallTimeout time.Duration
}

// deliveredUp passes a delivery at t up to the enclosing attempts: "In
// nested chains it marks every enclosing chain's attempt too, up to a
// Standalone context", and "which also restarts the attempt's
// Backend.StallTimeout" (both Delivered), so the enclosing attempts' stall ends,
// which cancel the contexts of the chains inside them, move.
func (mc *mcall) deliveredUp(t time.Duration) {
	for c := mc; c.encl != nil && !c.alone; c = c.encl.chain {
		u := c.encl
		u.delivered = true
		if u.stallTimeout > 0 {
			u.stallAt = t + u.stallTimeout
		}
	}
	mc.refreshCancel()
}

// refreshCancel sets when an inner chain's context is cancelled: when its
// enclosing chain's is, or when the enclosing attempt stalls (cancelled
// with the cause ErrStalled), whichever comes first. Standalone changes
// nothing here: "Cancellation and deadlines still flow from ctx".
func (mc *mcall) refreshCancel() {
	u := mc.encl
	if u == nil {
		return
	}
	up := u.chain
	up.refreshCancel()
	mc.m.apart(u.stallAt, up.cancelAt, "an enclosing attempt's stall and its caller's cancel")
	mc.cancelAt, mc.cancelBy = up.cancelAt, up.cancelBy
	if u.stallAt < mc.cancelAt {
		mc.cancelAt, mc.cancelBy = u.stallAt, "ErrStalled"
	}
}

// nestAttempt plays a Call that runs an inner chain with the context it
// received. That context ends at the earliest of the caller's cancel and
// deadline and the backend's own Timeout (a deadline, with the cause
// ErrAttemptTimeout) and StallTimeout (a cancel, with the cause
// ErrStalled), which its deliveries restart.
//
// Doc.go, "Nesting": while a backend whose Policy has waits is in flight,
// a chain run under its context makes one attempt per backend and never
// waits, unless it runs under Standalone, in which case it retries by its
// own policy. The outer record takes the Kind that Classify gives the inner
// error (a Truncated is truncated, a TimedOut a timeout, an Exhausted the
// Kind of its last attempt, and a Cancelled, by Classify's doc, cancelled),
// and the status, raw text and retry-after of the last inner attempt of
// that Kind.
//
// With n.share, the inner chain's first backend holds br, the enclosing
// backend's Breaker: "shared by every call and chain holding the same
// pointer".
func (mc *mcall) nestAttempt(db drawBackend, br *mbreaker, n *nestCfg, timeoutAt, stallAt time.Duration) result {
	m := mc.m
	start := mc.now
	ends := []struct {
		at time.Duration
		by string
	}{{timeoutAt, "timeout"}, {stallAt, "stall"}, {mc.cancelAt, "cancel"}, {mc.deadAt, "deadline"}}
	for i := range ends {
		for j := i + 1; j < len(ends); j++ {
			m.apart(ends[i].at, ends[j].at, "two ends of an attempt's context")
		}
	}
	in := &mcall{m: m, ci: mc.ci, start: start, depth: mc.depth + 1}
	in.ch = &mchain{backends: n.backends, next: make([]int, len(n.backends)), br: make([]*mbreaker, len(n.backends)), maxRaw: n.maxRaw}
	if n.share {
		in.ch.br[0] = br
	}
	// The mark of a backend with waits stays on the context of every
	// chain inside it, however deep, up to a Standalone.
	in.nested = !n.standalone && (len(db.policy.Waits) > 0 || mc.nested)
	up := &upAttempt{chain: mc, stallAt: stallAt, stallTimeout: db.stallTimeout}
	in.encl, in.alone = up, n.standalone
	in.refreshCancel()
	in.deadAt, in.deadBy, in.deadCause, in.hasDead = mc.deadAt, mc.deadBy, mc.deadCause, mc.hasDead
	if timeoutAt < in.deadAt {
		in.deadAt, in.deadBy, in.deadCause, in.hasDead = timeoutAt, "ErrAttemptTimeout", "ErrAttemptTimeout", true
	}
	in.play()
	if m.tie != "" {
		return result{}
	}
	io := in.out
	mc.out.Inner = append(mc.out.Inner, io)

	var res result
	res.ret = io.End
	res.delivered = up.delivered
	// Deliveries inside may have moved the stall ends, this attempt's and
	// its caller's.
	ends[1].at, ends[2].at = up.stallAt, mc.cancelAt
	for i := range ends {
		for j := i + 1; j < len(ends); j++ {
			m.apart(ends[i].at, ends[j].at, "two ends of an attempt's context")
		}
	}
	ce := forever
	for _, e := range ends {
		ce = minDur(ce, e.at)
	}
	// The inner chain returns at an end of its context only because of it
	// (its own tie checks cover a return there for any other reason). Its
	// checks see only the earliest end, though: a Call inside that
	// ignores its context may return at a later one, which then races it.
	for _, e := range ends {
		if e.at > ce {
			m.apart(res.ret, e.at, "an inner chain's return and a later end of its context")
		}
	}
	ctxDone := ce <= res.ret
	switch {
	case mc.cancelAt <= res.ret && mc.cancelAt < mc.deadAt:
		res.callerEnd = "cancel"
	case mc.deadAt <= res.ret:
		res.callerEnd = "deadline"
	}
	if io.ErrType == "nil" {
		res.ok, res.resp = true, io.Resp
		return res
	}
	res.err = "inner " + io.ErrType
	k := llmretry.KindCancelled
	switch io.ErrType {
	case "*Truncated":
		k = llmretry.KindTruncated
	case "*TimedOut":
		k = llmretry.KindTimeout
	case "*Exhausted":
		k = io.Attempts[len(io.Attempts)-1].Kind
	}
	for i := len(io.Attempts) - 1; i >= 0; i-- {
		if a := io.Attempts[i]; a.Kind == k {
			res.status, res.hint = a.Status, a.RetryAfter
			if a.Raw != "<nil>" {
				raw := a.Raw
				res.raw = &raw
			}
			break
		}
	}
	// AMBIGUOUS: when the attempt's context ended, its Kind is cancelled or
	// timeout whatever the inner chain gave; the status, raw text and
	// retry-after still come from the inner attempt of the Kind Classify
	// gives, as for a plain Call that returns a Failure after its context
	// ended. The model guessed so, and Do agrees.
	if m.d.ownInner {
		// A custom Chain.Classify "replaces that function whole": the
		// record's Kind is its answer. AMBIGUOUS: the details still
		// come from the last inner attempt of the Kind the package's
		// [Classify] gives, which is the function the Nesting section
		// names, and the reading Do follows (the model first took the
		// custom Kind's attempt; neither doc says which, for a custom
		// Classify).
		k = m.d.innerKind
	}
	switch {
	case res.callerEnd == "cancel":
		res.kind = llmretry.KindCancelled
	case res.callerEnd == "deadline":
		res.kind = llmretry.KindTimeout
	case ctxDone:
		// Ended by the backend's own Timeout or StallTimeout: timeout,
		// whatever the Call returned.
		res.kind = llmretry.KindTimeout
	default:
		res.kind = k
	}
	return res
}

// capRaw is the raw text a record keeps: "at most Chain.MaxRawText bytes
// of it, 64 KiB by default, the cut marked"; "longer output is
// cut at a character boundary and marked with " [llmretry: N bytes cut]".
// 0 means DefaultMaxRawText; negative means no limit" (Chain.MaxRawText).
// N is taken to count the bytes left out, and the mark to come on top of
// the bytes kept.
func capRaw(raw string, max int) string {
	if max == 0 {
		max = llmretry.DefaultMaxRawText
	}
	if max < 0 || len(raw) <= max {
		return raw
	}
	keep := max
	for keep > 0 && !utf8.RuneStart(raw[keep]) {
		keep--
	}
	return fmt.Sprintf("%s [llmretry: %d bytes cut]", raw[:keep], len(raw)-keep)
}
