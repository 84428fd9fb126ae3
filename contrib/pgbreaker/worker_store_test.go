package pgbreaker_test

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
	"github.com/llmretry/llmretry/llmretrytest"
)

// workerBreaker builds a worker's Breaker on the store kind names: "pg",
// this package's on dbURL, shared by every worker; "pg-default", the
// same with the Breaker's StoreTimeout at its default; "local", an in-memory
// store of the worker's own, which shares nothing with the others, as
// a Breaker per process does. It returns what closes the store.
func workerBreaker(kind, dbURL string) (*llmretry.Breaker, func(), error) {
	b := &llmretry.Breaker{Failures: fleetFailures, Cooldown: fleetCooldown, Key: model, StoreTimeout: fleetStoreTimeout}
	switch kind {
	case "local":
		b.Store = &countingStore{BreakerStore: &llmretrytest.MemoryStore{}}
		return b, func() {}, nil
	case "pg", "pg-default":
		if kind == "pg-default" {
			b.StoreTimeout = 0
		}
		pool, err := pgxpool.New(context.Background(), dbURL+"&pool_max_conns=16&pool_min_conns=8")
		if err != nil {
			return nil, nil, err
		}
		s := pgbreaker.New(pool)
		b.Store = &countingStore{BreakerStore: s}
		return b, func() { s.Close(); pool.Close() }, nil
	}
	return nil, nil, errors.New("pgbreaker: no such store: " + kind)
}
