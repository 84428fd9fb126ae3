package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// bucketDesk is a provider behind a token bucket of requests, in the
// test's clock: it holds burst, full at first, and refills one every
// interval. A request the bucket cannot pay for gets a 429 with a
// Retry-After; every response reports the bucket as the request left
// it, in OpenAI's headers. Request n takes latency(n) to answer.
type bucketDesk struct {
	burst    int64
	interval time.Duration
	latency  func(n int) time.Duration

	mu      sync.Mutex
	full    time.Time // when the bucket is full again
	n       int       // requests so far
	refused int       // of them, with a 429
}

func (d *bucketDesk) Call(ctx context.Context, req string) (string, error) {
	d.mu.Lock()
	now := time.Now()
	d.n++
	lat := d.latency(d.n)
	untilFull := max(d.full.Sub(now), 0)
	wait := max(untilFull+d.interval-time.Duration(d.burst)*d.interval, 0) // until it holds one
	if wait == 0 {
		untilFull += d.interval
		d.full = now.Add(untilFull)
	} else {
		d.refused++
	}
	missing := (untilFull + d.interval - 1) / d.interval
	h := limitHeader(int(d.burst), int(d.burst-int64(missing)), (untilFull+ms-1)/ms*ms)
	if wait > 0 {
		h.Set("Retry-After-Ms", strconv.FormatInt(int64((wait+ms-1)/ms), 10))
	}
	d.mu.Unlock()
	if !sleepCtx(ctx, lat) {
		return "", ctx.Err()
	}
	if wait > 0 {
		return "", llmretry.StatusFailure(http.StatusTooManyRequests, h, nil)
	}
	llmretry.ReportLimits(ctx, h)
	return "ok: " + req, nil
}

// A fleet of four processes, sharing a store, sends a burst of 20 calls
// at a bucket of 8 requests that refills 8 a second, each call with 5 s
// to go: the bucket drains in some 2 s, and every call is answered. No
// call is left waiting, paced, while the bucket has room: each change to
// the shared state reaches the calls waiting on it, whenever it lands.
// The runs differ in the store's latency, the answers' latencies and the
// order in which the calls come, so that changes land at many points of
// the waiting calls' decisions.
func TestSharedBreakerBurstDrains(t *testing.T) {
	for v := range 12 {
		t.Run(strconv.Itoa(v), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &llmretrytest.MemoryStore{Latency: time.Duration(1+v%3) * ms}
				brs := fleet(4, true, store)
				d := &bucketDesk{burst: 8, interval: 125 * ms, latency: func(n int) time.Duration {
					return time.Duration(50+(n*37+v*13)%200) * ms
				}}
				retry := llmretry.Policy{Waits: []time.Duration{100 * ms, 250 * ms, 500 * ms}, MaxWait: 5 * sec, Reserve: -1}
				chains := make([]*chain, len(brs))
				for i, br := range brs {
					chains[i] = &chain{Backends: []backend{{Model: "m", Call: d.Call, Retry: retry, Breaker: br}}}
				}
				var wg sync.WaitGroup
				for _, c := range chains { // a report for the fleet before the burst
					wg.Go(func() { c.Do(t.Context(), "warm") })
				}
				wg.Wait()
				time.Sleep(sec)
				errs := make([]error, 5*len(chains))
				for i := range errs {
					wg.Go(func() {
						time.Sleep(time.Duration(i*v%7) * ms)
						ctx, cancel := context.WithTimeout(t.Context(), 5*sec)
						defer cancel()
						if _, err := chains[i%len(chains)].Do(ctx, "burst"); err != nil {
							errs[i] = fmt.Errorf("call %d: %w", i, err)
						}
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Errorf("Do() = %v, want every call answered", err)
				}
				var storeErrs int64
				for _, br := range brs {
					storeErrs += br.State().StoreErrors
				}
				t.Logf("429s: %d; store calls: %+v, of which failed: %d", d.refused, store.Calls(), storeErrs)
			})
		})
	}
}
