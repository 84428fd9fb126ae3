package outage

import "github.com/llmretry/llmretry"

// breakerBuilt reports whether this build has llmretry's Breaker: the
// "llmretry + Breaker" row and its assertions are on when it does.
const breakerBuilt = true

// addBreaker gives backend b a default Breaker (open after 5 consecutive
// retryable failures or a retry-after hint, 30 s cooldown), shared by
// every call of the run's chain; it paces by the rate-limit reports it
// is given only when paced is set.
func addBreaker(b *llmretry.Backend[int, int], paced bool) {
	b.Breaker = &llmretry.Breaker{NoPacing: !paced}
}
