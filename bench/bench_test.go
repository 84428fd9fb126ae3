package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	retrygo4 "github.com/avast/retry-go/v4"
	retrygo5 "github.com/avast/retry-go/v5"
	backoff5 "github.com/cenkalti/backoff/v5"
	backoff7 "github.com/cenkalti/backoff/v7"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/fallback"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	goretry "github.com/sethvargo/go-retry"

	"github.com/llmretry/llmretry"
)

// The failures every library sees, allocated once: a 503 is retried in its
// backend, a 400 is not and fails over to the next backend. The peers get
// these same values, wrapped once (never per call) where their idiom asks
// for a marker.
var (
	errTransient error = llmretry.StatusFailure(503, nil, nil)
	errRejected  error = llmretry.StatusFailure(400, nil, nil)
)

// always is a fake backend's failure count when it never answers.
const always = -1

// state is one request's scratch: the benchmarks reset it before each call
// and the fake backends record in it. It is the request (Req) of the
// llmretry chain; the peers pass it to the backend from a closure.
type state struct {
	calls  int       // backend calls made for this request, all backends together
	t1, t2 time.Time // WaitPrecision: end of the first call, start of the second
}

// callFunc is a backend: the same shape as llmretry's Backend.Call.
type callFunc = func(ctx context.Context, s *state) (int, error)

// doFunc sends one request through a library configured for a case.
type doFunc = func(ctx context.Context, s *state) (int, error)

// fake is a backend that fails its first fails calls of a request (every
// call when fails is always) with err, then answers 42.
func fake(fails int, err error) callFunc {
	return func(_ context.Context, s *state) (int, error) {
		s.calls++
		if fails == always || s.calls <= fails {
			return 0, err
		}
		return 42, nil
	}
}

// plan is what a library is asked to set up, once, before the timed loop.
type plan struct {
	// ctx is bound into the configuration of libraries that take the
	// context up front (retry-go, failsafe-go). nil means the calls run
	// under context.Background, which those libraries default to, so they
	// are not given one.
	ctx    context.Context
	calls  []callFunc    // the backends, in order
	tries  int           // attempts per backend
	wait   time.Duration // wait between two attempts of one backend
	aborts bool          // some backend fails with the non-retryable error
	// s is the request state, for failsafe-go's fallback functions, which
	// are built once and so cannot take the request per call (see
	// buildFailsafe).
	s *state
}

// library is one way of doing the work: its name, its two failures in its
// own idiom, and how it is set up for a plan.
type library struct {
	name                string
	transient, rejected error
	build               func(p plan) doFunc
}

// libraries are the contestants, in the order of every table. direct and
// llmretry are not peers: ratios are taken to the fastest of the rest.
var libraries = []library{
	{"direct", errTransient, errRejected, buildDirect},
	{"llmretry", errTransient, errRejected, buildLLMRetry},
	// failsafe-go is told which error aborts retries (AbortOnErrors), so the
	// plain values do.
	{"failsafe-go", errTransient, errRejected, buildFailsafe},
	// backoff retries every error but a Permanent one.
	{"backoff-v5", errTransient, backoff5.Permanent(errRejected), buildBackoff5},
	{"backoff-v7", errTransient, backoff7.Permanent(errRejected), buildBackoff7},
	// retry-go retries every error but an Unrecoverable one.
	{"retry-go-v4", errTransient, retrygo4.Unrecoverable(errRejected), buildRetryGo4},
	{"retry-go-v5", errTransient, retrygo5.Unrecoverable(errRejected), buildRetryGo5},
	// go-retry retries only an error marked RetryableError.
	{"go-retry", goretry.RetryableError(errTransient), errRejected, buildGoRetry},
}

// buildDirect is the floor: a hand-written loop over the backends and
// tries, with no records, no classification and no options. It retries
// exactly the transient error. A context that can be cancelled is watched
// during a wait; otherwise the wait is time.Sleep, the reference for
// WaitPrecision.
func buildDirect(p plan) doFunc {
	calls, tries, wait := p.calls, p.tries, p.wait
	return func(ctx context.Context, s *state) (int, error) {
		var err error
		for _, call := range calls {
			for try := 1; ; try++ {
				var v int
				v, err = call(ctx, s)
				if err == nil {
					return v, nil
				}
				if err != errTransient || try == tries {
					break
				}
				if wait > 0 {
					if ctx.Done() == nil {
						time.Sleep(wait)
					} else if !sleepCtx(ctx, wait) {
						return 0, ctx.Err()
					}
				}
			}
		}
		return 0, err
	}
}

// sleepCtx waits for d, or reports false when ctx is done first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// buildLLMRetry is a Chain with one Backend per call, each retried
// tries-1 times after waits of p.wait.
func buildLLMRetry(p plan) doFunc {
	var waits []time.Duration
	if p.tries > 1 {
		waits = make([]time.Duration, p.tries-1)
		for i := range waits {
			waits[i] = p.wait
		}
	}
	c := &llmretry.Chain[*state, int]{}
	for i, call := range p.calls {
		c.Backends = append(c.Backends, llmretry.Backend[*state, int]{
			Model: fmt.Sprintf("model-%d", i),
			Call:  call,
			Retry: llmretry.Policy{Waits: waits},
		})
	}
	return c.Do
}

// buildFailsafe follows failsafe-go's docs: one RetryPolicy, built once and
// shared (it is concurrency safe), in an Executor built once; more backends
// are reached through Fallback policies composed outside the retry policy,
// failsafe.With(fallback, retryPolicy).
//
// The fallback functions are built once too and call the next backend
// with the request captured at build time (p.s). A real caller whose
// request changes per call would have to build the fallbacks per call or
// carry the request in the context; we give failsafe-go the cheaper set-up,
// since the benchmark reuses one request anyway.
func buildFailsafe(p plan) doFunc {
	rb := retrypolicy.NewBuilder[int]().WithMaxAttempts(p.tries)
	if p.wait > 0 {
		rb = rb.WithDelay(p.wait)
	}
	if p.aborts {
		rb = rb.AbortOnErrors(errRejected)
	}
	rp := rb.Build()
	s := p.s

	// Compose from the last backend back to the first: backend i runs under
	// the retry policy and, when it fails, falls back to executor i+1.
	var next failsafe.Executor[int]
	execs := make([]failsafe.Executor[int], len(p.calls))
	for i := len(p.calls) - 1; i >= 0; i-- {
		if next == nil {
			execs[i] = failsafe.With(rp)
		} else {
			nextExec, nextCall := next, p.calls[i+1]
			fb := fallback.NewWithFunc(func(exec failsafe.Execution[int]) (int, error) {
				return nextExec.Get(func() (int, error) { return nextCall(exec.Context(), s) })
			})
			execs[i] = failsafe.With(fb, rp)
		}
		if p.ctx != nil {
			execs[i] = execs[i].WithContext(p.ctx)
		}
		next = execs[i]
	}
	first, call := execs[0], p.calls[0]
	return func(ctx context.Context, s *state) (int, error) {
		return first.Get(func() (int, error) { return call(ctx, s) })
	}
}

// The peers' loops over the backends below repeat one another on purpose:
// a shared helper would put an extra indirect call in every peer's timed
// path, and no peer may be slowed down.

// buildBackoff5 follows backoff's README: Retry with options built once (a
// ZeroBackOff or ConstantBackOff is stateless, so it can be shared), and a
// plain loop over the backends, since backoff has no fallback.
func buildBackoff5(p plan) doFunc {
	var bo backoff5.BackOff = &backoff5.ZeroBackOff{}
	if p.wait > 0 {
		bo = backoff5.NewConstantBackOff(p.wait)
	}
	opts := []backoff5.RetryOption{backoff5.WithBackOff(bo), backoff5.WithMaxTries(uint(p.tries))}
	calls := p.calls
	return func(ctx context.Context, s *state) (int, error) {
		var err error
		for _, call := range calls {
			var v int
			v, err = backoff5.Retry(ctx, func() (int, error) { return call(ctx, s) }, opts...)
			if err == nil {
				return v, nil
			}
			if ctx.Err() != nil {
				break
			}
		}
		return 0, err
	}
}

// buildBackoff7 is buildBackoff5 for backoff's v7 API, which is the same.
func buildBackoff7(p plan) doFunc {
	var bo backoff7.BackOff = &backoff7.ZeroBackOff{}
	if p.wait > 0 {
		bo = backoff7.NewConstantBackOff(p.wait)
	}
	opts := []backoff7.RetryOption{backoff7.WithBackOff(bo), backoff7.WithMaxTries(uint(p.tries))}
	calls := p.calls
	return func(ctx context.Context, s *state) (int, error) {
		var err error
		for _, call := range calls {
			var v int
			v, err = backoff7.Retry(ctx, func() (int, error) { return call(ctx, s) }, opts...)
			if err == nil {
				return v, nil
			}
			if ctx.Err() != nil {
				break
			}
		}
		return 0, err
	}
}

// buildRetryGo4 follows retry-go v4's docs: DoWithData with an options
// slice built once. FixedDelay with Delay(0) is its zero wait (the default
// delay type adds up to 100ms of random jitter). A plain loop covers the
// backends, since retry-go has no fallback.
func buildRetryGo4(p plan) doFunc {
	opts := []retrygo4.Option{
		retrygo4.Attempts(uint(p.tries)),
		retrygo4.Delay(p.wait),
		retrygo4.DelayType(retrygo4.FixedDelay),
	}
	if p.ctx != nil {
		opts = append(opts, retrygo4.Context(p.ctx))
	}
	calls := p.calls
	return func(ctx context.Context, s *state) (int, error) {
		var err error
		for _, call := range calls {
			var v int
			v, err = retrygo4.DoWithData(func() (int, error) { return call(ctx, s) }, opts...)
			if err == nil {
				return v, nil
			}
			if ctx.Err() != nil {
				break
			}
		}
		return 0, err
	}
}

// buildRetryGo5 follows retry-go v5's docs: a RetrierWithData built once
// and reused ("can be safely reused across multiple retry operations").
// The context is part of that configuration (retry.Context), so a caller
// with a context per request has to build a retrier per call; the zero-wait
// cases run under context.Background, retry-go's default, and so measure
// the reused retrier, the cheaper set-up.
func buildRetryGo5(p plan) doFunc {
	opts := []retrygo5.Option{
		retrygo5.Attempts(uint(p.tries)),
		retrygo5.Delay(p.wait),
		retrygo5.DelayType(retrygo5.FixedDelay),
	}
	if p.ctx != nil {
		opts = append(opts, retrygo5.Context(p.ctx))
	}
	r := retrygo5.NewWithData[int](opts...)
	calls := p.calls
	return func(ctx context.Context, s *state) (int, error) {
		var err error
		for _, call := range calls {
			var v int
			v, err = r.Do(func() (int, error) { return call(ctx, s) })
			if err == nil {
				return v, nil
			}
			if ctx.Err() != nil {
				break
			}
		}
		return 0, err
	}
}

// buildGoRetry follows go-retry's README: DoValue with a Constant backoff
// wrapped in WithMaxRetries. The Constant is stateless and built once; the
// WithMaxRetries middleware counts retries, so it is built per call (a
// shared one would be used up by the first call). NewConstant panics on a
// zero wait, so the zero wait is one nanosecond.
func buildGoRetry(p plan) doFunc {
	base := goretry.NewConstant(max(p.wait, time.Nanosecond))
	retries := uint64(p.tries - 1)
	calls := p.calls
	return func(ctx context.Context, s *state) (int, error) {
		var err error
		for _, call := range calls {
			var v int
			v, err = goretry.DoValue(ctx, goretry.WithMaxRetries(retries, base), func(ctx context.Context) (int, error) {
				return call(ctx, s)
			})
			if err == nil {
				return v, nil
			}
			if ctx.Err() != nil {
				break
			}
		}
		return 0, err
	}
}

// backendSpec is one backend of a case: how many calls fail before it
// answers (always: none answer) and whether the failure is retryable.
type backendSpec struct {
	fails     int
	retryable bool
}

// overheadCase is a case measured with zero waits, so the figures are the
// libraries' own overhead.
type overheadCase struct {
	backends  []backendSpec
	tries     int           // attempts per backend
	wait      time.Duration // wait between tries; zero for the overhead cases
	wantCalls int           // backend calls one request makes
	wantOK    bool          // whether the request succeeds
}

// run benchmarks the case through every library, after checking once that
// each does the work the case describes.
func (oc overheadCase) run(b *testing.B) {
	for _, lib := range libraries {
		b.Run(lib.name, func(b *testing.B) {
			ctx := context.Background()
			s := new(state)
			p := plan{tries: oc.tries, wait: oc.wait, s: s}
			for _, bs := range oc.backends {
				err := lib.transient
				if !bs.retryable {
					err, p.aborts = lib.rejected, true
				}
				p.calls = append(p.calls, fake(bs.fails, err))
			}
			do := lib.build(p)

			_, err := do(ctx, s)
			if s.calls != oc.wantCalls || (err == nil) != oc.wantOK {
				b.Fatalf("%s: %d calls, err %v; want %d calls, success %t", lib.name, s.calls, err, oc.wantCalls, oc.wantOK)
			}

			b.ReportAllocs()
			for b.Loop() {
				s.calls = 0
				do(ctx, s)
			}
		})
	}
}

// BenchmarkFirstTry: one backend with a retry policy (three tries, zero
// waits) answers on the first try.
func BenchmarkFirstTry(b *testing.B) {
	overheadCase{
		backends:  []backendSpec{{fails: 0, retryable: true}},
		tries:     3,
		wantCalls: 1,
		wantOK:    true,
	}.run(b)
}

// BenchmarkFirstTryDeadline is FirstTry with a context of its own for each
// request, each with a deadline an hour away, as an agent host's turn or a
// job's lease gives: the use llmretry is built for. The contexts are made
// before the timed loop and taken in turn. Libraries that take the context
// per call are set up as in FirstTry. failsafe-go, retry-go v4 and retry-go
// v5 bind the context into their configuration, so they bind each
// request's in the cheapest way their API offers (see bindPerCall).
func BenchmarkFirstTryDeadline(b *testing.B) {
	ctxs := make([]context.Context, 1024)
	deadline := time.Now().Add(time.Hour)
	for i := range ctxs {
		var cancel context.CancelFunc
		ctxs[i], cancel = context.WithDeadline(context.Background(), deadline)
		defer cancel()
	}
	for _, lib := range libraries {
		b.Run(lib.name, func(b *testing.B) {
			s := new(state)
			p := plan{calls: []callFunc{fake(0, lib.transient)}, tries: 3, s: s}
			do := lib.build(p)
			if bind := bindPerCall[lib.name]; bind != nil {
				do = bind(p)
			}
			if v, err := do(ctxs[0], s); v != 42 || err != nil || s.calls != 1 {
				b.Fatalf("%s: got %d, %v after %d calls; want 42 after 1", lib.name, v, err, s.calls)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.calls = 0
				do(ctxs[i%len(ctxs)], s)
				i++
			}
		})
	}
}

// bindPerCall sets up, for BenchmarkFirstTryDeadline, the libraries whose
// configuration holds the context: everything but the context is built
// once, and each request's context is bound per call. They serve that case
// only: one backend, zero waits, nothing that aborts.
var bindPerCall = map[string]func(p plan) doFunc{
	// failsafe-go: an Executor built once; WithContext copies it per call,
	// the only way its API takes a context per execution.
	"failsafe-go": func(p plan) doFunc {
		exec := failsafe.With(retrypolicy.NewBuilder[int]().WithMaxAttempts(p.tries).Build())
		call := p.calls[0]
		return func(ctx context.Context, s *state) (int, error) {
			return exec.WithContext(ctx).Get(func() (int, error) { return call(ctx, s) })
		}
	},
	// retry-go v4: the options built once and passed as arguments, with the
	// request's Context option last. DoWithData does not keep its options,
	// so they stay on the stack; a slice appended per call would not.
	"retry-go-v4": func(p plan) doFunc {
		attempts, delay, fixed := retrygo4.Attempts(uint(p.tries)), retrygo4.Delay(p.wait), retrygo4.DelayType(retrygo4.FixedDelay)
		call := p.calls[0]
		return func(ctx context.Context, s *state) (int, error) {
			return retrygo4.DoWithData(func() (int, error) { return call(ctx, s) }, attempts, delay, fixed, retrygo4.Context(ctx))
		}
	},
	// retry-go v5: a retrier holds its context, so one is built per call,
	// from options built once and passed as arguments, as for v4.
	"retry-go-v5": func(p plan) doFunc {
		attempts, delay, fixed := retrygo5.Attempts(uint(p.tries)), retrygo5.Delay(p.wait), retrygo5.DelayType(retrygo5.FixedDelay)
		call := p.calls[0]
		return func(ctx context.Context, s *state) (int, error) {
			r := retrygo5.NewWithData[int](attempts, delay, fixed, retrygo5.Context(ctx))
			return r.Do(func() (int, error) { return call(ctx, s) })
		}
	},
}

// BenchmarkTwoFailures: one backend fails twice with a retryable error,
// then answers on its third and last try.
func BenchmarkTwoFailures(b *testing.B) {
	overheadCase{
		backends:  []backendSpec{{fails: 2, retryable: true}},
		tries:     3,
		wantCalls: 3,
		wantOK:    true,
	}.run(b)
}

// BenchmarkFailover: three backends, each with a retry policy; the first
// two fail once with an error that is not retried there, the third
// answers.
func BenchmarkFailover(b *testing.B) {
	overheadCase{
		backends: []backendSpec{
			{fails: always, retryable: false},
			{fails: always, retryable: false},
			{fails: 0, retryable: true},
		},
		tries:     3,
		wantCalls: 3,
		wantOK:    true,
	}.run(b)
}

// BenchmarkExhausted: three backends of three tries each, all failing with
// a retryable error: nine attempts and the error each library builds for
// them (llmretry: an *Exhausted with nine records; the peers: what they
// return for the last backend).
func BenchmarkExhausted(b *testing.B) {
	overheadCase{
		backends: []backendSpec{
			{fails: always, retryable: true},
			{fails: always, retryable: true},
			{fails: always, retryable: true},
		},
		tries:     3,
		wantCalls: 9,
		wantOK:    false,
	}.run(b)
}

// TestExhaustedRecords checks that the llmretry side of BenchmarkExhausted
// builds what the benchmark claims: an *Exhausted with nine records.
func TestExhaustedRecords(t *testing.T) {
	s := new(state)
	p := plan{tries: 3, s: s}
	for range 3 {
		p.calls = append(p.calls, fake(always, errTransient))
	}
	_, err := buildLLMRetry(p)(context.Background(), s)
	var ex *llmretry.Exhausted
	if !errors.As(err, &ex) || len(ex.Attempts) != 9 {
		t.Fatalf("Do() = %v, want an *Exhausted with 9 attempts", err)
	}
}

// parkWait is the retry wait the Parked calls sit in: long enough never to
// end during the measurement, short enough for every library to accept it
// without a limit of its own stepping in (backoff stops before any wait
// that would pass its 15-minute MaxElapsedTime default).
const parkWait = 10 * time.Minute

// BenchmarkParked measures what one call parked in a retry wait costs while
// it waits: many calls at once, each failed once and now waiting parkWait
// under one cancellable context. It reports per parked call the live heap
// (B/parked, from runtime.MemStats.HeapAlloc after a GC) and the live heap
// objects (allocs/parked), and the goroutine stack (stack-B/parked, from
// StackInuse), then cancels and waits for every call to return. Goroutine
// descriptors are reused from a warm-up, so they are in no figure; the
// harness's own share (the goroutine's closure) is in direct's. The runtime
// sizes new stacks from the average it saw at earlier GCs, so the stack
// figure compares libraries fairly only under
// GODEBUG=adaptivestackstart=0, which run.sh sets.
func BenchmarkParked(b *testing.B) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	warmGoroutines(n)
	for _, lib := range libraries {
		b.Run(lib.name, func(b *testing.B) {
			var heap, objects, stack float64
			rounds := 0
			b.ReportAllocs()
			for b.Loop() {
				h, o, st := parkRound(b, lib, n)
				heap, objects, stack = heap+h, objects+o, stack+st
				rounds++
			}
			b.ReportMetric(heap/float64(rounds), "B/parked")
			b.ReportMetric(objects/float64(rounds), "allocs/parked")
			// Goroutine stacks are reported too, so that memory moved from
			// the heap to the stack is not hidden.
			b.ReportMetric(stack/float64(rounds), "stack-B/parked")
		})
	}
}

// BenchmarkWaiting measures what one call waiting behind a Breaker costs
// while it waits, as BenchmarkParked does for a retry wait without one: the
// live heap, objects and goroutine stack per waiting call (B/waiting,
// allocs/waiting, stack-B/waiting), read once every call waits, before all
// are cancelled. in_line: calls come to a backend whose breaker is open and
// wait in its line for it to close (it is their last backend). retry: calls
// whose request failed with a 503 and its rate-limit headers, the breaker
// staying closed, wait to send again. The peers have no Breaker, so only
// llmretry is measured. Under GODEBUG=adaptivestackstart=0 (run.sh) the
// stack figure is the size the runtime grew each goroutine's stack to.
func BenchmarkWaiting(b *testing.B) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	warmGoroutines(n)
	for _, w := range []struct {
		name  string
		round func(*testing.B, int) parked
	}{{"in_line", lineRound}, {"retry", breakerRetryRound}} {
		b.Run(w.name, func(b *testing.B) {
			var heap, objects, stack float64
			rounds := 0
			b.ReportAllocs()
			for b.Loop() {
				p := w.round(b, n)
				heap, objects, stack = heap+p.heap, objects+p.objects, stack+p.stack
				rounds++
			}
			b.ReportMetric(heap/float64(rounds), "B/waiting")
			b.ReportMetric(objects/float64(rounds), "allocs/waiting")
			b.ReportMetric(stack/float64(rounds), "stack-B/waiting")
		})
	}
}

// lineRound opens a Breaker, has n calls wait in its line, and measures
// them.
func lineRound(b *testing.B, n int) parked {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sent atomic.Int64
	br := &llmretry.Breaker{Failures: 1, Cooldown: 30 * time.Second}
	chain := &llmretry.Chain[*state, int]{Backends: []llmretry.Backend[*state, int]{{
		Model: "m",
		Call: func(context.Context, *state) (int, error) {
			sent.Add(1)
			return 0, errTransient
		},
		Retry:   llmretry.Policy{Waits: []time.Duration{time.Minute}},
		Breaker: br,
	}}}
	// One failure opens it; that call's retry then waits in the line too.
	opener := make(chan struct{})
	go func() {
		defer close(opener)
		chain.Do(ctx, nil)
	}()
	for !br.State().Open {
		time.Sleep(time.Millisecond)
	}
	p := park(n, func() error { _, err := chain.Do(ctx, nil); return err }, untilQuiet, cancel)
	<-opener
	if got := sent.Load(); p.early != 0 || p.failed != int64(n) || got != 1 {
		b.Fatalf("%d of %d calls returned before the cancel, %d with an error, and %d requests were sent: want every call waiting until cancelled, one request", p.early, n, p.failed, got)
	}
	return p
}

// errLimited is a 503 with OpenAI's rate-limit headers, far from the limit:
// the Breaker that sees it learns a report and stays closed.
var errLimited error = llmretry.StatusFailure(503, http.Header{
	"X-Ratelimit-Limit-Requests":     {"10000000"},
	"X-Ratelimit-Remaining-Requests": {"9999999"},
	"X-Ratelimit-Reset-Requests":     {"6ms"},
}, nil)

// breakerRetryRound has n calls fail once through a Breaker that stays
// closed, each telling it a rate-limit report, and measures them waiting
// for their retry.
func breakerRetryRound(b *testing.B, n int) parked {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sent atomic.Int64
	chain := &llmretry.Chain[*state, int]{Backends: []llmretry.Backend[*state, int]{{
		Model: "m",
		Call: func(context.Context, *state) (int, error) {
			sent.Add(1)
			return 0, errLimited
		},
		Retry:   llmretry.Policy{Waits: []time.Duration{parkWait}},
		Breaker: &llmretry.Breaker{Failures: 1 << 30},
	}}}
	p := park(n, func() error { _, err := chain.Do(ctx, nil); return err }, func() {
		for sent.Load() < int64(n) {
			time.Sleep(time.Millisecond)
		}
		untilQuiet()
	}, cancel)
	if got := sent.Load(); p.early != 0 || p.failed != int64(n) || got != int64(n) {
		b.Fatalf("%d of %d calls returned before the cancel, %d with an error, and %d requests were sent: want every call sent once, then waiting until cancelled", p.early, n, p.failed, got)
	}
	return p
}

// untilQuiet returns once nothing has been allocated for 20 ms: the calls
// started have all come to their wait.
func untilQuiet() {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	last := m.Mallocs
	for quiet := 0; quiet < 2; {
		time.Sleep(10 * time.Millisecond)
		runtime.ReadMemStats(&m)
		if m.Mallocs == last {
			quiet++
		} else {
			quiet, last = 0, m.Mallocs
		}
	}
}

// warmGoroutines runs n goroutines at once and lets them end, so that the
// runtime keeps n goroutine descriptors for reuse and the first library
// measured does not pay for them.
func warmGoroutines(n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	wg.Add(n)
	for range n {
		go func() {
			defer wg.Done()
			<-release
		}()
	}
	close(release)
	wg.Wait()
}

// parkRound parks n calls through lib and returns the live heap bytes and
// objects per parked call.
func parkRound(b *testing.B, lib library, n int) (heap, objects, stack float64) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reached atomic.Int64
	call := func(context.Context, *state) (int, error) {
		reached.Add(1)
		return 0, lib.transient
	}
	do := lib.build(plan{ctx: ctx, calls: []callFunc{call}, tries: 2, wait: parkWait})
	p := park(n, func() error { _, err := do(ctx, nil); return err }, func() {
		for reached.Load() < int64(n) {
			time.Sleep(time.Millisecond)
		}
		// Every call has failed once; the last few still step from the
		// failed attempt into the wait.
		time.Sleep(20 * time.Millisecond)
	}, cancel)
	if p.early != 0 {
		b.Fatalf("%s: %d of %d calls returned before the cancel: they did not wait", lib.name, p.early, n)
	}
	if p.failed != int64(n) {
		b.Fatalf("%s: %d of %d cancelled calls returned an error", lib.name, p.failed, n)
	}
	return p.heap, p.objects, p.stack
}

// parked is what n calls waiting at once cost, per call, and how they
// ended.
type parked struct {
	heap, objects, stack float64 // live heap bytes, heap objects and goroutine stack bytes per call
	early                int64   // calls that returned before the cancel: they did not wait
	failed               int64   // calls that returned an error, the cancelled ones included
}

// park runs n calls of do at once, measures them once waiting has
// returned (every call is then waiting), then cancels them and waits for
// every one to return.
func park(n int, do func() error, waiting func(), cancel context.CancelFunc) parked {
	var p parked
	var returned, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		go func() {
			defer wg.Done()
			err := do()
			returned.Add(1)
			if err != nil {
				failed.Add(1)
			}
		}()
	}
	waiting()
	runtime.GC()
	runtime.ReadMemStats(&after)
	p.early = returned.Load()
	cancel()
	wg.Wait()
	p.failed = failed.Load()
	perCall := func(a, b uint64) float64 { return float64(int64(a)-int64(b)) / float64(n) }
	p.heap = perCall(after.HeapAlloc, before.HeapAlloc)
	p.objects = perCall(after.Mallocs-after.Frees, before.Mallocs-before.Frees)
	p.stack = perCall(after.StackInuse, before.StackInuse)
	return p
}

// BenchmarkWaitPrecision asks each library for one wait of 1ms, 10ms and
// 100ms on the real clock, one sample per iteration: from the end of the
// failed first call to the start of the second. It reports the median and
// p99 of the overshoot beyond the asked length (over-p50-ns, over-p99-ns);
// direct waits with time.Sleep, the reference. It is a measurement, not a
// test: nothing fails on the figures.
func BenchmarkWaitPrecision(b *testing.B) {
	for _, d := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond} {
		b.Run(d.String(), func(b *testing.B) {
			for _, lib := range libraries {
				b.Run(lib.name, func(b *testing.B) {
					s := new(state)
					call := func(_ context.Context, s *state) (int, error) {
						s.calls++
						if s.calls == 1 {
							s.t1 = time.Now()
							return 0, lib.transient
						}
						s.t2 = time.Now()
						return 42, nil
					}
					do := lib.build(plan{calls: []callFunc{call}, tries: 2, wait: d, s: s})
					ctx := context.Background()
					over := make([]time.Duration, 0, 1024)
					b.ReportAllocs()
					for b.Loop() {
						s.calls = 0
						if _, err := do(ctx, s); err != nil || s.calls != 2 {
							b.Fatalf("%s: %d calls, err %v; want 2 calls and success", lib.name, s.calls, err)
						}
						over = append(over, s.t2.Sub(s.t1)-d)
					}
					slices.Sort(over)
					b.ReportMetric(float64(quantile(over, 0.50)), "over-p50-ns")
					b.ReportMetric(float64(quantile(over, 0.99)), "over-p99-ns")
				})
			}
		})
	}
}

// quantile returns the nearest-rank q-quantile of sorted samples.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// The overhead cases (FirstTry, TwoFailures, Failover, Exhausted) wait zero
// between tries, so the figures are bookkeeping rather than sleeping, and
// llmretry starts no timer for a zero wait while every peer starts one per
// retry. The two
// cases below make that difference visible: the same work with the
// smallest positive wait, 1ns, so that every library, llmretry included,
// arms a timer for each retry.

// BenchmarkTwoFailuresWaiting is TwoFailures with a 1ns wait before each
// retry.
func BenchmarkTwoFailuresWaiting(b *testing.B) {
	overheadCase{
		backends:  []backendSpec{{fails: 2, retryable: true}},
		tries:     3,
		wait:      time.Nanosecond,
		wantCalls: 3,
		wantOK:    true,
	}.run(b)
}

// BenchmarkExhaustedWaiting is Exhausted with a 1ns wait before each retry.
func BenchmarkExhaustedWaiting(b *testing.B) {
	overheadCase{
		backends: []backendSpec{
			{fails: always, retryable: true},
			{fails: always, retryable: true},
			{fails: always, retryable: true},
		},
		tries:     3,
		wait:      time.Nanosecond,
		wantCalls: 9,
		wantOK:    false,
	}.run(b)
}
