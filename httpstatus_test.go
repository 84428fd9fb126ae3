package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmretry/llmretry"
)

// answerWith is a backend Call that answers after took with err, or with
// "answer" when err is nil, or fails with its context's error when that
// ends first.
func answerWith(took time.Duration, err error) func(context.Context, string) (string, error) {
	return func(ctx context.Context, _ string) (string, error) {
		t := time.NewTimer(took)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if err != nil {
			return "", err
		}
		return "answer", nil
	}
}

// status is a failure with an HTTP status, and a Retry-After of after
// seconds when after is not 0, and an x-should-retry of "false" when
// final is set (a spent quota, say).
func status(code int, after int, final bool) *llmretry.Failure {
	h := http.Header{}
	if after > 0 {
		h.Set("Retry-After", strconv.Itoa(after))
	}
	if final {
		h.Set("X-Should-Retry", "false")
	}
	return llmretry.StatusFailure(code, h, fmt.Errorf("http %d", code))
}

// HTTPStatus answers for what Do returned, in each of the outcomes it
// names: real calls against fake backends, in virtual time, so that the
// Retry-After is exact. Each backend's call takes a second: a hint is
// counted from the end of its attempt, and the soonest one wins.
func TestHTTPStatus(t *testing.T) {
	const s = time.Second
	refusedWith403 := status(403, 0, false)
	refusedWith403.Kind = llmretry.KindRefused
	tests := []struct {
		name      string
		calls     []func(context.Context, string) (string, error) // one per backend
		breaker   bool                                            // every backend has a Breaker, opened first for 20s by a 503
		timeout   time.Duration                                   // each backend's Timeout
		deadline  time.Duration                                   // the caller's deadline; 0 for none
		cancelAt  time.Duration                                   // when the caller cancels; 0 for never
		wantCode  int
		wantAfter time.Duration
	}{
		{name: "success", calls: calls(answerWith(s, nil)), wantCode: 200},
		{name: "config", calls: nil, wantCode: 500},
		{name: "cancelled", calls: calls(answerWith(time.Hour, nil)), cancelAt: s, wantCode: 499},
		{name: "backend_timeout", calls: calls(answerWith(time.Hour, nil)), timeout: 10 * s, wantCode: 504},
		{name: "caller_deadline", calls: calls(answerWith(time.Hour, nil)), deadline: 10 * s, wantCode: 504},
		{name: "truncated", calls: calls(answerWith(s, llmretry.Truncation("the answer is"))), wantCode: 502},
		{name: "truncated_with_retry_after", calls: calls(answerWith(s, status(503, 30, false)), answerWith(s, llmretry.Truncation("the"))), wantCode: 502},
		{name: "refused_in_a_200", calls: calls(answerWith(s, llmretry.Refusal("finish_reason content_filter"))), wantCode: 400},
		{name: "refused_with_its_status", calls: calls(answerWith(s, refusedWith403)), wantCode: 403},
		{name: "rejected_everywhere", calls: calls(answerWith(s, status(400, 0, false)), answerWith(s, status(413, 0, false))), wantCode: 413},
		{name: "quota_spent_everywhere", calls: calls(answerWith(s, status(429, 60, true)), answerWith(s, status(429, 90, true))), wantCode: 429, wantAfter: 59 * s},
		{name: "retry_after_everywhere", calls: calls(answerWith(s, status(503, 30, false)), answerWith(s, status(429, 20, false))), wantCode: 503, wantAfter: 20 * s},
		{name: "retry_after_not_everywhere", calls: calls(answerWith(s, status(503, 30, false)), answerWith(s, status(500, 0, false))), wantCode: 502},
		{name: "breakers_open", calls: calls(answerWith(s, nil), answerWith(s, nil)), breaker: true, wantCode: 503, wantAfter: 20 * s},
		{name: "down_everywhere", calls: calls(answerWith(s, status(500, 0, false)), answerWith(s, errors.New("connection reset"))), wantCode: 502},
		{name: "rejected_then_down", calls: calls(answerWith(s, status(400, 0, false)), answerWith(s, status(503, 0, false))), wantCode: 502},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				chain := &llmretry.Chain[string, string]{}
				for i, call := range tc.calls {
					b := llmretry.Backend[string, string]{Model: "m" + strconv.Itoa(i), Call: call, Timeout: tc.timeout}
					if tc.breaker {
						b.Breaker = &llmretry.Breaker{Failures: 1, Cooldown: 20 * s}
						opener := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
							{Model: "opener", Breaker: b.Breaker, Call: answerWith(0, status(503, 0, false))},
						}}
						if _, err := opener.Do(context.Background(), "open"); err == nil {
							t.Fatal("opener.Do() = nil error, want the 503 that opens the breaker")
						}
					}
					chain.Backends = append(chain.Backends, b)
				}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				if tc.cancelAt > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					defer cancel()
					time.AfterFunc(tc.cancelAt, cancel)
				}
				_, err := chain.Do(ctx, "question")
				code, after := llmretry.HTTPStatus(err)
				if code != tc.wantCode || after != tc.wantAfter {
					t.Errorf("HTTPStatus(%v) = %d, %v, want %d, %v", err, code, after, tc.wantCode, tc.wantAfter)
				}
			})
		})
	}
}

// calls lists a chain's backend Calls.
func calls(c ...func(context.Context, string) (string, error)) []func(context.Context, string) (string, error) {
	return c
}

// Errors that are not what Do returns get the status their meaning
// calls for, wrapped or not.
func TestHTTPStatusOtherErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"context_canceled", fmt.Errorf("handler: %w", context.Canceled), 499},
		{"deadline_exceeded", context.DeadlineExceeded, 504},
		{"config_wrapped", fmt.Errorf("setting up: %w", llmretry.ErrConfig), 500},
		{"wrapped_timed_out", fmt.Errorf("answer: %w", &llmretry.TimedOut{}), 504},
		{"other", errors.New("something else"), 502},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if code, after := llmretry.HTTPStatus(tc.err); code != tc.want || after != 0 {
				t.Errorf("HTTPStatus(%v) = %d, %v, want %d, 0", tc.err, code, after, tc.want)
			}
		})
	}
}
