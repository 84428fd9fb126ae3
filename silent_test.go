package llmretry_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// netTimeoutErr is a transport's own timeout, such as a dial or a
// response-header timeout: classified as a timeout, with no output.
type netTimeoutErr struct{}

func (netTimeoutErr) Error() string   { return "i/o timeout" }
func (netTimeoutErr) Timeout() bool   { return true }
func (netTimeoutErr) Temporary() bool { return true }

var _ net.Error = netTimeoutErr{}

// With Policy.FailOverSilent, an attempt that times out before any output
// costs the call one try: the chain fails over at once, where without it
// the backend would be retried. Output of any kind, delivered or only
// progress, makes the attempt not silent; and on the last backend the
// usual rules retry it.
func TestDoFailOverSilent(t *testing.T) {
	const stallTimeout = 5 * time.Second
	interactive := llmretry.Policy{Waits: []time.Duration{200 * ms, time.Second}, MaxTries: 3, FailOverSilent: true}
	tests := []struct {
		name    string
		reply   func(context.Context, int) error // backend a's
		policy  llmretry.Policy                  // backend a's
		stall   time.Duration                    // backend a's StallTimeout
		timeout time.Duration                    // backend a's Timeout
		alone   bool                             // a is the only backend
		want    []string                         // the records, as model/try/next/why
		wantEnd time.Duration                    // when Do returns
	}{
		{
			name:    "never_answers",
			reply:   hang,
			policy:  interactive,
			stall:   stallTimeout,
			want:    []string{"a 1 fail_over silent", "b 1 ok"},
			wantEnd: stallTimeout,
		},
		{
			// The same provider without the setting: retried, as
			// before, until MaxTries.
			name:    "never_answers_without_setting",
			reply:   hang,
			policy:  llmretry.Policy{Waits: []time.Duration{200 * ms, time.Second}, MaxTries: 3},
			stall:   stallTimeout,
			want:    []string{"a 1 retry ", "a 2 retry ", "a 3 fail_over waits_used", "b 1 ok"},
			wantEnd: 3*stallTimeout + 200*ms + time.Second,
		},
		{
			// A first token slower than StallTimeout is as silent.
			name:    "slow_first_token",
			reply:   firstThen(stream(3, 20*time.Second, false)),
			policy:  interactive,
			stall:   stallTimeout,
			want:    []string{"a 1 fail_over silent", "b 1 ok"},
			wantEnd: stallTimeout,
		},
		{
			// A plain request timed out by Timeout had no output either.
			name:    "plain_request_timeout",
			reply:   hang,
			policy:  interactive,
			timeout: 10 * time.Second,
			want:    []string{"a 1 fail_over silent", "b 1 ok"},
			wantEnd: 10 * time.Second,
		},
		{
			// A transport's own timeout is a timeout too.
			name:    "transport_timeout",
			reply:   script(netTimeoutErr{}),
			policy:  interactive,
			want:    []string{"a 1 fail_over silent", "b 1 ok"},
			wantEnd: 0,
		},
		{
			// Progress is output: a held stream that stalled after it is
			// retried as the policy says, its backend not silent.
			name:    "stall_after_progress",
			reply:   firstThen(buffered(2, 100*ms, true)),
			policy:  interactive,
			stall:   stallTimeout,
			want:    []string{"a 1 retry ", "a 2 ok"},
			wantEnd: 200*ms + stallTimeout + 200*ms + 300*ms,
		},
		{
			// Other failures keep their rules.
			name:    "transient_is_retried",
			reply:   script(busy("down")),
			policy:  interactive,
			stall:   stallTimeout,
			want:    []string{"a 1 retry ", "a 2 ok"},
			wantEnd: 200 * ms,
		},
		{
			// The last backend: nothing to fail over to, so its waits
			// and tries are the call's to spend.
			name:    "last_backend_retried",
			reply:   hangFirst,
			policy:  interactive,
			stall:   stallTimeout,
			alone:   true,
			want:    []string{"a 1 retry ", "a 2 ok"},
			wantEnd: stallTimeout + 200*ms + 300*ms,
		},
		{
			// Without Waits the setting still names why.
			name:    "no_waits",
			reply:   hang,
			policy:  llmretry.Policy{FailOverSilent: true},
			stall:   stallTimeout,
			want:    []string{"a 1 fail_over silent", "b 1 ok"},
			wantEnd: stallTimeout,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				a, b := newFake("a", tc.reply), newFake("b", answers)
				rec := newRecorder()
				c := &chain{
					Backends:  []backend{{Model: "a", Call: a.Call, Retry: tc.policy, StallTimeout: tc.stall, Timeout: tc.timeout}},
					OnAttempt: rec.OnAttempt,
				}
				if !tc.alone {
					c.Backends = append(c.Backends, backend{Model: "b", Call: b.Call})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if _, err := c.Do(ctx, "hi"); err != nil {
					t.Fatalf("Do() = %v, want an answer", err)
				}
				if end := time.Since(start); end != tc.wantEnd {
					t.Errorf("Do() returned after %v, want %v", end, tc.wantEnd)
				}
				seen, _ := rec.seen()
				var got []string
				for _, r := range seen {
					line := r.Model + " " + strconv.Itoa(r.Try) + " " + string(r.Next) + " " + string(r.Why)
					if r.Err == nil {
						line = r.Model + " " + strconv.Itoa(r.Try) + " ok"
					}
					got = append(got, line)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
			})
		})
	}
}
