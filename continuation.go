package llmretry

import (
	"context"
	"errors"
	"slices"
)

// This file holds continuation: how a call goes on after an attempt
// failed having delivered part of its answer (Chain.Continue,
// Chain.Restart), and what a backend is told to continue from.

// Continuation is what an attempt is asked to continue: the part of the
// answer that has reached the caller already. A backend reads it with
// [Continuing].
type Continuation struct {
	// Text is the answer so far, as the caller received it through
	// [Emit]. The attempt answers with what follows it: it hands only
	// that to Emit, and a successful answer's text is Text and what
	// follows, whole, never the part alone.
	Text string
	// Resume is what the backend's last attempt that streamed this
	// answer left with [SetResume], such as the id of a response it can
	// go on reading; nil when the attempt goes to another backend, or
	// when none was left.
	Resume any
}

// Continuing returns what the attempt running under ctx is to continue,
// and true, when the chain sends it to go on with an answer the caller
// holds part of ([Chain.Continue]); otherwise false. It is only ever
// true for a backend whose [Backend.CanContinue] said yes to the same
// Continuation.
func Continuing(ctx context.Context) (Continuation, bool) {
	if ctx == nil {
		return Continuation{}, false
	}
	a, _ := ctx.Value(markKey{}).(*attemptCtx)
	if a == nil || a.cont == nil {
		return Continuation{}, false
	}
	return *a.cont, true
}

// SetResume tells the chain how a later attempt of the same backend could
// resume the answer that the attempt under ctx is streaming, should it
// fail: such as the id of a response the provider keeps generating in the
// background and the last event read of it. The chain hands the last
// state set to the backend's next attempt at this answer, as
// Continuation.Resume; a nil state says that none of the attempt's answer
// can be resumed. It keeps the state of the last attempt that set one, or
// none once an attempt that set none has delivered more text. With a
// context that is not an attempt's it does nothing. It is safe to call
// from any goroutine.
func SetResume(ctx context.Context, state any) {
	if ctx == nil {
		return
	}
	if a, _ := ctx.Value(markKey{}).(*attemptCtx); a != nil {
		a.textMu.Lock()
		a.resume, a.resumeSet = state, true
		a.textMu.Unlock()
	}
}

// ErrCannotContinue is wrapped by the error of an attempt whose backend
// could not continue the answer it was asked to ([Continuing]), such as a
// model that refused an assistant prefill with a 400. The chain then
// takes the call to a backend that can continue it, or starts the answer
// again ([Chain.Restart]), as if the backend had said so beforehand
// through [Backend.CanContinue]; the record keeps the attempt with its
// Kind. The backend should learn from it and say no from then on.
var ErrCannotContinue = errors.New("llmretry: the backend cannot continue the answer")

// took adds what an attempt of backend bi delivered, and the resume state
// it left, to what the call holds.
func (r *run[Req, Resp]) took(bi int, end *ended) {
	if end.bare {
		r.bare = true
	}
	switch {
	case end.resumeSet:
		r.resume, r.resumeOf = end.resume, bi
	case end.emitted != "":
		r.resume = nil // a state left before this text is behind it
	}
	r.held += end.emitted
}

// holds reports whether the caller holds part of the answer: an attempt
// since the last restart delivered.
func (r *run[Req, Resp]) holds() bool { return r.held != "" || r.bare }

// mayRecover reports whether the call may go on after a failure that left
// the caller holding part of the answer: the chain allows it, the text
// the caller holds is known, and the call is not nested (the enclosing
// chain decides for its own attempt).
func (r *run[Req, Resp]) mayRecover() bool {
	return (r.c.Continue || r.c.Restart) && !r.bare && !r.nested
}

// restartOK reports whether the call may start the answer again: the
// chain allows it and the call's stream can be told.
func (r *run[Req, Resp]) restartOK() bool { return r.c.Restart && r.sink != nil }

// continuation is what backend bi would be asked to continue.
func (r *run[Req, Resp]) continuation(bi int) Continuation {
	c := Continuation{Text: r.held}
	if r.resumeOf == bi {
		c.Resume = r.resume
	}
	return c
}

// canContinueOn reports whether backend bi can continue the answer the
// caller holds.
func (r *run[Req, Resp]) canContinueOn(bi int) bool {
	b := &r.c.Backends[bi]
	return r.c.Continue && r.held != "" && b.CanContinue != nil && !slices.Contains(r.cannot, bi) && b.CanContinue(r.continuation(bi))
}

// laterCanContinue reports whether a backend after bi in the chain can
// continue the answer the caller holds.
func (r *run[Req, Resp]) laterCanContinue(bi int) bool {
	for j := bi + 1; j < len(r.c.Backends); j++ {
		if r.canContinueOn(j) {
			return true
		}
	}
	return false
}

// recover adjusts decision d, the usual one after failed attempt a of
// backend b, when the caller holds part of the answer and the call may
// go on: a retry goes on only where the backend can continue, or where
// the answer may start again; otherwise the call fails over to a
// backend that can continue, or stops as it would have without
// recovery. A continuation the backend refused is treated as a
// transient failure would be, by a restart.
func (r *run[Req, Resp]) recover(b *Backend[Req, Resp], a *Attempt, end *ended, d decision) decision {
	bi := a.Backend
	stop := decision{next: NextStop, why: WhyDelivered, at: end.at}
	failOver := decision{next: NextFailOver, why: WhyCannotContinue, at: end.at}
	if a.ContinuedFrom > 0 && errors.Is(a.Err, ErrCannotContinue) {
		// Whatever the backend says from now on, it is not asked again
		// in this call.
		r.cannot = append(r.cannot, bi)
		switch {
		case r.laterCanContinue(bi):
			return failOver
		case !r.restartOK():
			return stop
		}
		w, why := r.nextWait(b, a.Try, a.Try, 0, end.at)
		if why == "" {
			return decision{next: NextRetry, wait: w, at: end.at}
		}
		return decision{next: giveUp(why, r.plan.last(a.Kind)), why: why, at: end.at}
	}
	switch d.next {
	case NextRetry:
		switch {
		case r.canContinueOn(bi):
			return d
		case r.laterCanContinue(bi):
			return failOver
		case r.restartOK():
			return d
		}
		return stop
	case NextFailOver:
		if r.laterCanContinue(bi) || r.restartOK() {
			return d
		}
		return stop
	}
	return d
}

// prepare sets what the next request to backend bi carries when the
// caller holds part of the answer: a continuation, where bi can continue
// it; else, when no later backend can and the chain allows it, a restart,
// which it tells the call's stream at once. It reports false when bi is
// to be passed over: it cannot continue the answer and a later backend
// can, or the answer may not start again.
func (r *run[Req, Resp]) prepare(bi int) bool {
	r.cont = nil
	switch {
	case !r.holds():
		return true
	case !r.mayRecover():
		// Not reached: the call stops when the caller holds part of an
		// answer it may not go on from. Sending now would send it twice.
		return false
	case r.canContinueOn(bi):
		c := r.continuation(bi)
		r.cont = &c
		return true
	case r.laterCanContinue(bi) || !r.restartOK():
		// A backend's answer to CanContinue can change between the
		// decision and here (another call learned that it cannot): then
		// too the backend is passed over rather than sent the answer
		// again.
		return false
	}
	r.sink.send(Chunk{Restart: true})
	r.held, r.resume, r.restarting = "", nil, true
	return true
}
