package outage

import "github.com/llmretry/llmretry"

// breakerBuilt reports whether this build has llmretry's Breaker: the
// "llmretry + Breaker" row and its assertions are on when it does.
const breakerBuilt = true

// addBreaker gives backend b a default Breaker (open after 5 consecutive
// retryable failures or a retry-after hint, 30 s cooldown), shared by
// every call of the run's chain.
func addBreaker(b *llmretry.Backend[int, int]) {
	b.Breaker = &llmretry.Breaker{}
}
