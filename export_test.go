package llmretry

import (
	"net/http"
	"time"
)

// This file lends the external tests (package llmretry_test) what they
// check of the package's internals. Those tests are external because
// they use llmretrytest, which imports this package.

// Limits is what parseLimits read of one response, for the external
// tests.
type Limits struct {
	RequestsLimit, RequestsRemaining int64
	TokensLimit, TokensRemaining     int64
	RequestsNext                     time.Time // when the requests bucket admits the next request
	RetryAt                          time.Time // when Retry-After said to try again; zero when none
}

// ParseLimits is parseLimits, for the external tests.
func ParseLimits(h http.Header, sent, read time.Time) (Limits, bool) {
	r, ok := parseLimits(h, sent, read)
	return Limits{
		RequestsLimit: r.requests.limit, RequestsRemaining: r.requests.remaining,
		TokensLimit: r.tokens.limit, TokensRemaining: r.tokens.remaining,
		RequestsNext: r.requests.next, RetryAt: r.retryAt,
	}, ok
}
