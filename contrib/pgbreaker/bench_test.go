package pgbreaker_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
)

// countingStore counts the calls a Breaker makes to the store under it.
type countingStore struct {
	llmretry.BreakerStore
	loads, swaps, watches atomic.Int64
}

func (s *countingStore) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	s.watches.Add(1)
	return s.BreakerStore.Watch(ctx, key)
}

func (s *countingStore) Load(ctx context.Context, key string) ([]byte, int64, error) {
	s.loads.Add(1)
	return s.BreakerStore.Load(ctx, key)
}

// Noticed passes the store's notices through: they are no store call,
// and a Breaker under a wrapper that hid them would load for each.
func (s *countingStore) Noticed(key string) ([]byte, int64, bool) {
	return noticedOf(s.BreakerStore, key)
}

// noticedOf is s's Noticed, when its notices carry the state.
func noticedOf(s llmretry.BreakerStore, key string) ([]byte, int64, bool) {
	if n, ok := s.(llmretry.StateNotifier); ok {
		return n.Noticed(key)
	}
	return nil, 0, false
}

func (s *countingStore) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	s.swaps.Add(1)
	return s.BreakerStore.CompareAndSwap(ctx, key, version, next)
}

// BenchmarkRequest is the cost of the store to one request through a
// Breaker on it: the store calls per request (loads/op, swaps/op) and
// the time, on this machine's PostgreSQL, of a call whose backend
// answers at once, so that ns/op is nearly all the store's. Each answer
// carries rate-limit headers, as a provider's do, so the Breaker keeps a
// report and paces; the bucket is large enough never to hold a call
// back. "serial" sends one request at a time; "parallel" sends from
// GOMAXPROCS goroutines of one process at once, where writes conflict
// and are decided again.
func BenchmarkRequest(b *testing.B) {
	url := pgURL(b)
	for _, parallel := range []bool{false, true} {
		name := "serial"
		if parallel {
			name = "parallel"
		}
		b.Run(name, func(b *testing.B) {
			pool := newPool(b, freshSchema(b, url, "pgbreaker_bench"))
			if err := pgbreaker.Migrate(context.Background(), pool); err != nil {
				b.Fatalf("Migrate() = %v", err)
			}
			s := pgbreaker.New(pool)
			defer s.Close()
			cs := &countingStore{BreakerStore: s}
			br := &llmretry.Breaker{Store: cs, Key: "bench/" + b.Name() + "/" + strconv.FormatInt(time.Now().UnixNano(), 36), StoreTimeout: time.Second}
			h := http.Header{}
			h.Set("x-ratelimit-limit-requests", "1000000")
			h.Set("x-ratelimit-remaining-requests", "999999")
			h.Set("x-ratelimit-reset-requests", "1ms")
			c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
				Model: model,
				Call: func(ctx context.Context, _ string) (string, error) {
					llmretry.ReportLimits(ctx, h)
					return "ok", nil
				},
				Breaker: br,
			}}}
			do := func() {
				if _, err := c.Do(context.Background(), "hi"); err != nil {
					b.Errorf("Do() = %v", err)
				}
			}
			do() // the row exists, the pool is warm
			cs.loads.Store(0)
			cs.swaps.Store(0)
			b.ResetTimer()
			if parallel {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						do()
					}
				})
			} else {
				for b.Loop() {
					do()
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cs.loads.Load())/float64(b.N), "loads/op")
			b.ReportMetric(float64(cs.swaps.Load())/float64(b.N), "swaps/op")
			if st := br.State(); st.StoreErrors > 0 {
				b.ReportMetric(float64(st.StoreErrors)/float64(b.N), "store-errors/op")
			}
		})
	}
}
