package llmretry

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// statusClientClosedRequest is 499, the status nginx introduced for a
// request whose client went away before the answer: net/http has no name
// for it.
const statusClientClosedRequest = 499

// HTTPStatus returns the HTTP status that a handler or a gateway in front
// of a chain should answer with for err, the error [Chain.Do] returned,
// and how long a client should wait before it sends the request again (a
// Retry-After to set when it is not 0). In order:
//
//   - nil: 200 (http.StatusOK), the call succeeded;
//   - an error wrapping [ErrConfig]: 500, the chain is set up wrong, which
//     is the service's fault and no client's;
//   - a [*Cancelled], or context.Canceled: 499, nginx's "client closed
//     request", the caller withdrew (no response may reach it);
//   - a [*Truncated]: 502, the providers' answers were cut off at the
//     completion budget, so no complete answer came back: that is a bad
//     answer from upstream, not a fault of the client's request, and it
//     comes with no Retry-After, since re-sending it would be cut off
//     again (raise the budget instead);
//   - a [*TimedOut], or context.DeadlineExceeded: 504, upstream did not
//     answer in time;
//   - an [*Exhausted] whose [RetryItem] is false (a provider refused the
//     content, or every backend rejected the request): the providers'
//     own answer, the status of the last record with a 4xx one (400 when
//     none has: a refusal often arrives in a 200 whose finish reason
//     says so), and with a 429 (a spent quota) the Retry-After of
//     [RetryItemAfter] when a provider said when;
//   - an [*Exhausted] for which [RetryItemAfter] says when a provider
//     would take work again (a retry-after hint on every backend, or
//     every backend skipped for an open breaker): 503 with that wait;
//   - otherwise, an Exhausted among them: 502 (http.StatusBadGateway),
//     every upstream failed.
//
// The rules look only at the outcome and its records, so a [*Cancelled]
// whose Cause is a sibling's 400 is still 499. The Retry-After is a
// Duration: round it up to whole seconds for the header.
func HTTPStatus(err error) (status int, retryAfter time.Duration) {
	if err == nil {
		return http.StatusOK, 0
	}
	if errors.Is(err, ErrConfig) {
		return http.StatusInternalServerError, 0
	}
	var (
		cancelled *Cancelled
		truncated *Truncated
		timedOut  *TimedOut
		exhausted *Exhausted
	)
	switch {
	case errors.As(err, &cancelled), errors.Is(err, context.Canceled):
		return statusClientClosedRequest, 0
	case errors.As(err, &truncated):
		return http.StatusBadGateway, 0
	case errors.As(err, &timedOut), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, 0
	case !errors.As(err, &exhausted):
		return http.StatusBadGateway, 0
	}
	after, _ := RetryItemAfter(err)
	if !RetryItem(err) {
		status := lastClientError(exhausted.Attempts)
		if status != http.StatusTooManyRequests {
			after = 0
		}
		return status, after
	}
	if after > 0 {
		return http.StatusServiceUnavailable, after
	}
	return http.StatusBadGateway, 0
}

// lastClientError is the status of the last record answered with a 4xx
// status, or 400 when none was.
func lastClientError(attempts []Attempt) int {
	for i := len(attempts) - 1; i >= 0; i-- {
		if s := attempts[i].Status; s >= 400 && s <= 499 {
			return s
		}
	}
	return http.StatusBadRequest
}
