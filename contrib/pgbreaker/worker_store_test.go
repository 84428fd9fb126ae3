package pgbreaker_test

import (
	"errors"

	"github.com/llmretry/llmretry"
)

// workerBreaker builds a worker's Breaker on the store kind names.
func workerBreaker(kind, dbURL string) (*llmretry.Breaker, func(), error) {
	b := &llmretry.Breaker{Failures: fleetFailures, Cooldown: fleetCooldown}
	switch kind {
	case "local":
		return b, func() {}, nil
	}
	_ = dbURL
	return nil, nil, errors.New("pgbreaker: no such store: " + kind)
}
