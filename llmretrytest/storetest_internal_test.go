package llmretrytest

import (
	"context"
	"testing"

	"github.com/llmretry/llmretry"
)

// A store that writes at any version, or keeps the caller's bytes, fails
// the conformance checks: the suite can fail.
func TestBreakerStoreChecksCatchBrokenStores(t *testing.T) {
	tests := []struct {
		name  string
		store func() llmretry.BreakerStore
		fails string // the check that must fail
	}{
		{name: "ignores_version", store: func() llmretry.BreakerStore { return &anyVersion{} }, fails: "compare_and_swap"},
		{name: "keeps_bytes", store: func() llmretry.BreakerStore { return &keepsBytes{} }, fails: "not_kept"},
		{name: "works", store: func() llmretry.BreakerStore { return &MemoryStore{} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var failed []string
			for _, c := range storeChecks {
				if err := c.check(tc.store(), "k"); err != nil {
					failed = append(failed, c.name)
				}
			}
			if tc.fails == "" && len(failed) > 0 {
				t.Errorf("checks %v failed a working store", failed)
			}
			if tc.fails != "" && !contains(failed, tc.fails) {
				t.Errorf("checks that failed: %v, want %q among them", failed, tc.fails)
			}
		})
	}
}

func contains(s []string, x string) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

// anyVersion writes whatever version is asked.
type anyVersion struct{ MemoryStore }

func (s *anyVersion) CompareAndSwap(ctx context.Context, key string, _ int64, next []byte) (bool, error) {
	_, ver, err := s.MemoryStore.Load(ctx, key)
	if err != nil {
		return false, err
	}
	return s.MemoryStore.CompareAndSwap(ctx, key, ver, next)
}

// keepsBytes keeps the slice it is given, and hands it out.
type keepsBytes struct {
	MemoryStore
	last map[string][]byte
}

func (s *keepsBytes) CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (bool, error) {
	ok, err := s.MemoryStore.CompareAndSwap(ctx, key, version, next)
	if ok {
		if s.last == nil {
			s.last = map[string][]byte{}
		}
		s.last[key] = next
	}
	return ok, err
}

func (s *keepsBytes) Load(ctx context.Context, key string) ([]byte, int64, error) {
	st, ver, err := s.MemoryStore.Load(ctx, key)
	if b, ok := s.last[key]; ok && err == nil {
		return b, ver, nil
	}
	return st, ver, err
}
