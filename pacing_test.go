package llmretry_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/llmretry/llmretry"
)

// limitHeader is a response header in OpenAI's form for a requests
// bucket of limit, holding remaining, full again after reset.
func limitHeader(limit, remaining int, reset time.Duration) http.Header {
	h := http.Header{}
	h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(limit))
	h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(remaining))
	h.Set("X-Ratelimit-Reset-Requests", reset.String())
	return h
}

// pacedRecorder keeps the records OnAttempt hears, from any goroutine.
type pacedRecorder struct {
	mu   sync.Mutex
	recs []llmretry.Attempt
}

func (r *pacedRecorder) on(_ context.Context, a llmretry.Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, a)
}

// A report that no request is left closes the backend to the next call
// until the provider admits one, without a failure counted: the call
// skips it with Why paced, Kind transient and RetryAfter the time until
// then, and the fallback answers. With NoPacing the call goes through.
func TestPacedSkip(t *testing.T) {
	tests := []struct {
		name     string
		noPacing bool
		wantSent int // requests to the primary
	}{
		{name: "paced", wantSent: 1},
		{name: "no_pacing", noPacing: true, wantSent: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				br := &llmretry.Breaker{NoPacing: tc.noPacing}
				sent := 0
				primary := func(ctx context.Context, req string) (string, error) {
					sent++
					llmretry.ReportLimits(ctx, limitHeader(1, 0, 2*time.Second))
					return "primary", nil
				}
				fallback := func(context.Context, string) (string, error) { return "fallback", nil }
				var rec pacedRecorder
				c := &chain{Backends: []backend{{Model: "p", Call: primary, Breaker: br}, {Model: "f", Call: fallback}}, OnAttempt: rec.on}
				if got, err := c.Do(t.Context(), "1"); got != "primary" || err != nil {
					t.Fatalf("Do() = %q, %v, want primary, nil", got, err)
				}
				read := time.Now()
				time.Sleep(500 * time.Millisecond)
				got, err := c.Do(t.Context(), "2")
				if sent != tc.wantSent || err != nil {
					t.Fatalf("Do() = %q, %v with %d sent to the primary, want %d", got, err, sent, tc.wantSent)
				}
				if tc.noPacing {
					return
				}
				st := br.State()
				if st.Open || st.Failures != 0 || st.Remaining != 0 || !st.NextAdmission.Equal(read.Add(2*time.Second)) {
					t.Errorf("State() = %+v, want closed, no failures, 0 remaining, next admission at %v", st, read.Add(2*time.Second))
				}
				want := llmretry.Attempt{
					Backend: 0, Model: "p", Try: 1, Kind: llmretry.KindTransient, Start: time.Now(), Skipped: true,
					Next: llmretry.NextFailOver, Why: llmretry.WhyPaced, RetryAfter: 1500 * time.Millisecond,
				}
				if got != "fallback" || len(rec.recs) != 3 {
					t.Fatalf("Do() = %q with records %v, want fallback after one skip", got, rec.recs)
				}
				if diff := cmp.Diff(want, rec.recs[1], cmpopts.EquateErrors()); diff != "" {
					t.Errorf("skip record (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// On the last backend the call can try, a paced call waits in line until
// the provider admits the next request, as for a breaker a retry-after
// hint opened: with no retry waits at all it still waits, within MaxWait
// and the reserve. When the admission lies past what the deadline allows,
// it stops at once, with Why paced.
func TestPacedWaitOnLastBackend(t *testing.T) {
	tests := []struct {
		name     string
		deadline time.Duration // 0: none
		wantErr  bool
	}{
		{name: "waits_until_next", wantErr: false},
		{name: "long_deadline", deadline: time.Hour, wantErr: false},
		{name: "past_the_reserve", deadline: 3 * time.Second, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				br := &llmretry.Breaker{}
				var sends []time.Time
				call := func(ctx context.Context, req string) (string, error) {
					sends = append(sends, time.Now())
					llmretry.ReportLimits(ctx, limitHeader(1, 0, 2*time.Second))
					return "ok", nil
				}
				var rec pacedRecorder
				c := &chain{Backends: []backend{{Model: "m", Call: call, Breaker: br}}, OnAttempt: rec.on}
				if _, err := c.Do(t.Context(), "1"); err != nil {
					t.Fatalf("Do() = %v, want nil", err)
				}
				ctx := t.Context()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				began := time.Now()
				_, err := c.Do(ctx, "2")
				if tc.wantErr {
					last := rec.recs[len(rec.recs)-1]
					if err == nil || len(sends) != 1 || last.Why != llmretry.WhyPaced || last.Next != llmretry.NextStop || last.RetryAfter != 2*time.Second {
						t.Errorf("Do() = %v, %d sent, last record %+v; want a paced stop with RetryAfter 2s and no send", err, len(sends), last)
					}
					return
				}
				if err != nil || len(sends) != 2 {
					t.Fatalf("Do() = %v with %d sent, want nil, 2", err, len(sends))
				}
				if got := sends[1].Sub(began); got != 2*time.Second {
					t.Errorf("second request sent %v after Do began, want 2s: at the next admission, never before", got)
				}
				wait := rec.recs[1]
				if !wait.Skipped || wait.Next != llmretry.NextRetry || wait.RetryIn != 2*time.Second || wait.Kind != llmretry.KindTransient {
					t.Errorf("wait record = %+v, want a skip retried after 2s", wait)
				}
			})
		})
	}
}

// When nothing the breaker let through is in flight and the provider's
// next admission has come, it lets one call through, even though the
// answers before it carried no report: calls behind an empty bucket go
// one at a time, not all at once, and none waits for good.
func TestPacingLiveness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{}
		var (
			mu    sync.Mutex
			sends []time.Duration
			first = true
		)
		began := time.Now()
		call := func(ctx context.Context, req string) (string, error) {
			mu.Lock()
			sends = append(sends, time.Since(began))
			report := first
			first = false
			mu.Unlock()
			if report {
				llmretry.ReportLimits(ctx, limitHeader(1, 0, time.Second))
				return "ok", nil
			}
			time.Sleep(100 * time.Millisecond) // answers that say nothing of the limits
			return "ok", nil
		}
		c := &chain{Backends: []backend{{Model: "m", Call: call, Breaker: br}}}
		if _, err := c.Do(t.Context(), "first"); err != nil {
			t.Fatalf("Do() = %v, want nil", err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond) // a line in a known order
				_, errs[i] = c.Do(t.Context(), "next")
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("Do() = %v, want every call answered", err)
		}
		want := []time.Duration{0, time.Second, 1100 * time.Millisecond, 1200 * time.Millisecond}
		if diff := cmp.Diff(want, sends); diff != "" {
			t.Errorf("sends (-want +got):\n%s", diff)
		}
	})
}

// The freshest report is the one whose request was sent last: a quick
// answer to a later request, which arrives first, beats a slow one sent
// before it. The send is the attempt's start, not when the report came;
// and the slow request, in flight at that send, is counted in S: it may
// have reached the provider after the quick one.
func TestPacingFreshestBySend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{}
		call := func(ctx context.Context, req string) (string, error) {
			if req == "slow" {
				time.Sleep(2 * time.Second)
				llmretry.ReportLimits(ctx, limitHeader(10, 5, time.Minute))
				return "ok", nil
			}
			time.Sleep(200 * time.Millisecond)
			llmretry.ReportLimits(ctx, limitHeader(10, 3, time.Minute))
			return "ok", nil
		}
		c := &chain{Backends: []backend{{Model: "m", Call: call, Breaker: br}}}
		began := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { c.Do(t.Context(), "slow") })
		time.Sleep(time.Second)
		wg.Go(func() { c.Do(t.Context(), "quick") })
		wg.Wait()
		st := br.State()
		if st.Remaining != 3 || st.Reported.Sub(began) != time.Second || st.LetThrough != 1 {
			t.Errorf("State() = %+v, want the quick report: 3 remaining, sent at 1s, the slow one, in flight then, counted", st)
		}
	})
}

// A backend that returns StatusFailure reports its limits without
// another line; a 429 with Retry-After still opens the breaker for the
// hint. Of two reports of one attempt, the one with fewer remaining wins.
func TestStatusFailureReportsLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{}
		call := func(ctx context.Context, req string) (string, error) {
			llmretry.ReportLimits(ctx, limitHeader(10, 4, 10*time.Second))
			h := limitHeader(10, 2, 10*time.Second)
			if req == "429" {
				h = limitHeader(10, 0, 10*time.Second)
				h.Set("Retry-After", "3")
				return "", llmretry.StatusFailure(http.StatusTooManyRequests, h, nil)
			}
			return "", llmretry.StatusFailure(http.StatusInternalServerError, h, nil)
		}
		c := &chain{Backends: []backend{{Model: "m", Call: call, Breaker: br}}}
		c.Do(t.Context(), "500")
		if st := br.State(); st.Remaining != 2 || st.Open {
			t.Errorf("after a 500: State() = %+v, want 2 remaining, closed", st)
		}
		c.Do(t.Context(), "429")
		st := br.State()
		if st.Remaining != 0 || !st.Open || time.Until(st.Until) != 3*time.Second {
			t.Errorf("after a 429: State() = %+v, want 0 remaining, open for its 3s hint", st)
		}
	})
}

// ReportLimits outside an attempt, or with nothing to report, does
// nothing.
func TestReportLimitsOutsideAttempt(t *testing.T) {
	h := limitHeader(1, 0, time.Second)
	llmretry.ReportLimits(context.Background(), h)
	//lint:ignore SA1012 a nil context is what this checks: ReportLimits must not panic on it
	llmretry.ReportLimits(nil, h)
	llmretry.ReportLimits(context.Background(), nil)
	br := &llmretry.Breaker{}
	call := func(ctx context.Context, req string) (string, error) {
		llmretry.ReportLimits(ctx, nil)
		llmretry.ReportLimits(ctx, http.Header{"X-Ratelimit-Remaining-Requests": {"garbage"}})
		return "ok", nil
	}
	c := &chain{Backends: []backend{{Model: "m", Call: call, Breaker: br}}}
	if _, err := c.Do(t.Context(), "x"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	if st := br.State(); !st.Reported.IsZero() {
		t.Errorf("State() = %+v, want no report", st)
	}
}

// A Failure built before its attempt (as a fake's often is) read its
// headers then: the next admission it reports moves with the attempt, so
// the breaker never lets a request go early by it.
func TestPrebuiltStatusFailureIsNotEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := llmretry.StatusFailure(http.StatusInternalServerError, limitHeader(10, 0, 10*time.Second), nil)
		time.Sleep(time.Minute)
		br := &llmretry.Breaker{}
		call := func(ctx context.Context, req string) (string, error) { return "", f }
		c := &chain{Backends: []backend{{Model: "m", Call: call, Breaker: br}}}
		sent := time.Now()
		c.Do(t.Context(), "x")
		// 10 missing refill in 10s: the next one 1s after the read, which
		// is the attempt's, not the Failure's a minute before.
		if got, want := br.State().NextAdmission, sent.Add(time.Second); got.Before(want) {
			t.Errorf("State().NextAdmission = %v, want no earlier than %v", got, want)
		}
	})
}

// A tokens bucket refills steadily to full at its reset, and the breaker
// counts what it refilled since the freshest report was read, not one
// request of it: 100 of 1000 tokens left, full again in 9 s, refills 100
// a second, so 4 s after the reading, with no report since, it holds 500,
// room for five requests of 100 tokens in flight at once and not a sixth.
func TestPacedCountsTokensRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		sent := 0
		primary := func(ctx context.Context, req string) (string, error) {
			mu.Lock()
			sent++
			first := sent == 1
			mu.Unlock()
			if first {
				h := http.Header{}
				h.Set("X-Ratelimit-Limit-Tokens", "1000")
				h.Set("X-Ratelimit-Remaining-Tokens", "100")
				h.Set("X-Ratelimit-Reset-Tokens", "9s")
				llmretry.ReportLimits(ctx, h)
				return "primary", nil
			}
			time.Sleep(time.Second) // in flight while the others ask; answers without a report
			return "primary", nil
		}
		fallback := func(context.Context, string) (string, error) { return "fallback", nil }
		est := func(string) llmretry.Usage { return llmretry.Usage{InputTokens: 60, OutputTokens: 40} }
		c := &chain{Backends: []backend{
			{Model: "p", Call: primary, Breaker: &llmretry.Breaker{}, Estimate: est},
			{Model: "f", Call: fallback},
		}}
		if got, err := c.Do(t.Context(), "report"); got != "primary" || err != nil {
			t.Fatalf("Do() = %q, %v, want primary, nil", got, err)
		}
		time.Sleep(4 * time.Second)
		got := make([]string, 6)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() {
				got[i], _ = c.Do(t.Context(), strconv.Itoa(i))
			})
			synctest.Wait() // in order: each asks once the one before has been let through or skipped
		}
		wg.Wait()
		want := []string{"primary", "primary", "primary", "primary", "primary", "fallback"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("answers 4s after the reading (-want +got):\n%s", diff)
		}
	})
}
