package llmretry

import (
	"context"
	"time"
)

type BreakerStore interface {
	Load(ctx context.Context, key string) (state []byte, version int64, err error)
	CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (ok bool, err error)
	Watch(ctx context.Context, key string) (<-chan struct{}, error)
}

const DefaultStoreTimeout = 50 * time.Millisecond
const DefaultProbeLease = 2 * time.Minute

type fleet struct {
	errs int64
	down bool
	err  error
}

func (b *Breaker) probeExpiry() time.Time { return time.Time{} }

func (b *Breaker) fleetAdmit(now time.Time, w *waiter) verdict {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dispatch(now)
	return b.answer(now, w)
}
func (b *Breaker) fleetWait(now time.Time, w *waiter, start, end time.Time, v verdict) *waiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	w = b.enqueue(now, w, start, end, v)
	b.dispatch(now)
	return w
}
func (b *Breaker) fleetExpire(now time.Time, w *waiter) (verdict, bool) { return verdict{}, false }
func (b *Breaker) fleetLeave(w *waiter)                                   {}
func (b *Breaker) fleetObserve(now time.Time, t ticket, o outcome)        {}
func (b *Breaker) fleetTick()                                             {}
