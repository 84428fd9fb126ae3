package llmretry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// step is what a record says followed it.
type step struct {
	Next    llmretry.Next
	Why     llmretry.Why
	RetryIn time.Duration
}

func stepsOf(attempts []llmretry.Attempt) []step {
	var s []step
	for _, a := range attempts {
		s = append(s, step{a.Next, a.Why, a.RetryIn})
	}
	return s
}

// recordsOf returns the attempts of any of the chain's errors.
func recordsOf(t *testing.T, err error) []llmretry.Attempt {
	t.Helper()
	var c *llmretry.Cancelled
	if errors.As(err, &c) {
		return c.Attempts
	}
	return exhausted(t, err)
}

// Every failed attempt's record says what the chain did next and, when it
// did not retry, why; the records in the returned error say what actually
// happened, though OnAttempt was told what was decided when the attempt
// ended.
func TestDoRecordsSayNextAndWhy(t *testing.T) {
	const s = time.Second
	var (
		retry = llmretry.NextRetry
		over  = llmretry.NextFailOver
		stop  = llmretry.NextStop
	)
	h := http.Header{}
	h.Set("Retry-After", "600")
	limited := llmretry.StatusFailure(429, h, errors.New("slow down"))
	delivered := func(ctx context.Context, _ int) error {
		llmretry.Delivered(ctx)
		return busy("stream broke")
	}
	withdrawn := func(context.Context, int) error { return errors.Join(errors.New("client gone"), context.Canceled) }
	tests := []struct {
		name     string
		deadline time.Duration // 0: none
		cancelAt time.Duration // 0: never
		hook     time.Duration // how long OnAttempt takes
		a, b     func(context.Context, int) error
		policy   llmretry.Policy // of backend a; b has none
		wantErr  []step          // the records in the returned error
		wantSeen []step          // what OnAttempt saw; nil: the same as wantErr
	}{
		{
			name: "retry_then_waits_used", a: always(busy("a")), b: always(busy("b")), policy: waits(30 * ms),
			wantErr: []step{{retry, "", 30 * ms}, {over, llmretry.WhyWaitsUsed, 0}, {stop, llmretry.WhyWaitsUsed, 0}},
		},
		{
			name: "zero_wait_is_a_retry", a: always(busy("a")), b: answers, policy: waits(0),
			wantSeen: []step{{retry, "", 0}, {over, llmretry.WhyWaitsUsed, 0}, {}},
		},
		{
			name: "zero_last_wait_does_not_repeat", deadline: time.Hour, a: always(busy("a")), b: always(busy("b")), policy: waits(0),
			wantErr: []step{{retry, "", 0}, {over, llmretry.WhyWaitsUsed, 0}, {stop, llmretry.WhyWaitsUsed, 0}},
		},
		{
			name: "not_retryable", a: always(llmretry.StatusFailure(400, nil, errors.New("bad"))), b: always(busy("b")), policy: waits(s),
			wantErr: []step{{over, llmretry.WhyNotRetryable, 0}, {stop, llmretry.WhyWaitsUsed, 0}},
		},
		{
			// 10s reserves 5s; a 6s wait would leave 4s.
			name: "reserve", deadline: 10 * s, a: always(busy("a")), b: always(busy("b")), policy: waits(6 * s),
			wantErr: []step{{over, llmretry.WhyReserve, 0}, {stop, llmretry.WhyWaitsUsed, 0}},
		},
		{
			name: "max_wait", a: always(limited), b: always(busy("b")), policy: waits(s),
			wantErr: []step{{over, llmretry.WhyMaxWait, 0}, {stop, llmretry.WhyWaitsUsed, 0}},
		},
		{
			name: "delivered", a: delivered, b: answers, policy: waits(0),
			wantErr: []step{{stop, llmretry.WhyDelivered, 0}},
		},
		{
			name: "deadline_mid_call", deadline: s, a: hang, b: answers, policy: waits(0),
			wantErr: []step{{stop, llmretry.WhyDeadline, 0}},
		},
		{
			name: "cancelled_mid_call", cancelAt: s, a: hang, b: answers, policy: waits(0),
			wantErr: []step{{stop, llmretry.WhyCancelled, 0}},
		},
		{
			name: "backend_withdrew", a: withdrawn, b: answers, policy: waits(0),
			wantErr: []step{{stop, llmretry.WhyCancelled, 0}},
		},
		{
			name: "cancelled_during_wait", cancelAt: s, a: always(busy("a")), b: answers, policy: waits(10 * s),
			wantErr:  []step{{stop, llmretry.WhyCancelled, 0}},
			wantSeen: []step{{retry, "", 10 * s}},
		},
		{
			name: "deadline_during_hook", deadline: 10 * s, hook: 20 * s, a: always(busy("a")), b: answers,
			policy:   llmretry.Policy{Waits: []time.Duration{s}, Reserve: -1},
			wantErr:  []step{{stop, llmretry.WhyDeadline, 0}},
			wantSeen: []step{{retry, "", s}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.deadline > 0 {
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				if tc.cancelAt > 0 {
					time.AfterFunc(tc.cancelAt, cancel)
				}
				var seen []llmretry.Attempt
				c := &chain{
					Backends: []backend{
						{Model: "a", Call: newFake("a", tc.a).Call, Retry: tc.policy},
						{Model: "b", Call: newFake("b", tc.b).Call},
					},
					OnAttempt: func(_ context.Context, a llmretry.Attempt) {
						seen = append(seen, a)
						time.Sleep(tc.hook)
					},
				}

				_, err := c.Do(ctx, "hi")
				if tc.wantErr != nil {
					if diff := cmp.Diff(tc.wantErr, stepsOf(recordsOf(t, err))); diff != "" {
						t.Errorf("records in the error (-want +got):\n%s", diff)
					}
				} else if err != nil {
					t.Errorf("Do() error = %v, want nil", err)
				}
				wantSeen := tc.wantSeen
				if wantSeen == nil {
					wantSeen = tc.wantErr
				}
				if diff := cmp.Diff(wantSeen, stepsOf(seen)); diff != "" {
					t.Errorf("records OnAttempt saw (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A chain inside another chain's retrying attempt makes one attempt per
// backend, and its records say so.
func TestDoNestedRecordsSayNested(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := &chain{Backends: []backend{
			{Model: "x", Call: newFake("x", always(busy("x"))).Call, Retry: waits(10 * ms)},
			{Model: "y", Call: newFake("y", always(busy("y"))).Call, Retry: waits(10 * ms)},
		}}
		outer := &chain{Backends: []backend{{Model: "outer", Call: inner.Do, Retry: waits(10 * ms)}}}

		_, err := outer.Do(context.Background(), "hi")
		attempts := exhausted(t, err)
		if diff := cmp.Diff([]step{{llmretry.NextRetry, "", 10 * ms}, {llmretry.NextStop, llmretry.WhyWaitsUsed, 0}}, stepsOf(attempts)); diff != "" {
			t.Errorf("outer records (-want +got):\n%s", diff)
		}
		for i, at := range attempts {
			want := []step{{llmretry.NextFailOver, llmretry.WhyNested, 0}, {llmretry.NextStop, llmretry.WhyNested, 0}}
			if diff := cmp.Diff(want, stepsOf(exhausted(t, at.Err))); diff != "" {
				t.Errorf("inner records of outer attempt %d (-want +got):\n%s", i, diff)
			}
		}
	})
}

// String is one line that ends with what followed, in words.
func TestAttemptStringSaysWhatFollowed(t *testing.T) {
	tests := []struct {
		name string
		a    llmretry.Attempt
		want string
	}{
		{
			name: "retry_in",
			a:    llmretry.Attempt{Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: busy("busy"), Next: llmretry.NextRetry, RetryIn: 30 * ms},
			want: "[backend 0 gpt-4o try 1] http 503: busy (retrying in 30ms)",
		},
		{
			name: "retry_at_once",
			a:    llmretry.Attempt{Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: busy("busy"), Next: llmretry.NextRetry},
			want: "[backend 0 gpt-4o try 1] http 503: busy (retrying at once)",
		},
		{
			name: "failing_over",
			a:    llmretry.Attempt{Model: "gpt-4o", Try: 2, Kind: llmretry.KindTransient, Status: 503, Err: busy("busy"), Next: llmretry.NextFailOver, Why: llmretry.WhyReserve},
			want: "[backend 0 gpt-4o try 2] http 503: busy (failing over: reserve)",
		},
		{
			name: "stopping",
			a:    llmretry.Attempt{Backend: 1, Model: "claude", Try: 1, Kind: llmretry.KindTransient, Err: errors.New("stream broke"), Next: llmretry.NextStop, Why: llmretry.WhyDelivered, Delivered: true},
			want: "[backend 1 claude try 1] stream broke (stopping: delivered)",
		},
		{
			name: "multi_line_error_is_one_line",
			a:    llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindUnknown, Err: errors.New("first\nsecond"), Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable},
			want: "[backend 0 a try 1] first (stopping: not_retryable)",
		},
		{
			name: "success",
			a:    llmretry.Attempt{Backend: 1, Model: "b", Try: 1, Elapsed: ms},
			want: "[backend 1 b try 1] ok",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.a.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

// absent marks a JSON key that must not be there.
type absent struct{}

// decodeNumbers decodes a JSON object keeping numbers as written.
func decodeNumbers(t *testing.T, b []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return m
}

// checkKeys compares the keys of m named in want: a value, or absent.
func checkKeys(t *testing.T, m map[string]any, want map[string]any) {
	t.Helper()
	for k, w := range want {
		v, ok := m[k]
		if _, mustLack := w.(absent); mustLack {
			if ok {
				t.Errorf("key %q = %v, want it absent", k, v)
			}
			continue
		}
		if !ok {
			t.Errorf("key %q absent, want %v", k, w)
			continue
		}
		if diff := cmp.Diff(w, v); diff != "" {
			t.Errorf("key %q (-want +got):\n%s", k, diff)
		}
	}
}

// The JSON keys and values of the records are exact: job queues and
// dead-letter tables store them.
func TestAttemptJSONNextWhy(t *testing.T) {
	start := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		a    llmretry.Attempt
		want map[string]any
	}{
		{
			name: "retry_with_hint",
			a: llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 429, Err: errors.New("slow down"), Start: start,
				Elapsed: 1500 * time.Microsecond, RetryAfter: 2 * time.Second, Next: llmretry.NextRetry, RetryIn: 2*time.Second + 1},
			want: map[string]any{
				"kind": "transient", "error": "slow down", "elapsed_ms": json.Number("1.5"),
				"retry_after_ms": json.Number("2000"), "next": "retry", "why": absent{}, "retry_in_ms": json.Number("2000.000001"),
			},
		},
		{
			name: "retry_at_once",
			a:    llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: errors.New("busy"), Start: start, Elapsed: 1, Next: llmretry.NextRetry},
			want: map[string]any{
				"elapsed_ms": json.Number("0.000001"), "retry_after_ms": absent{}, "next": "retry", "why": absent{}, "retry_in_ms": json.Number("0"),
			},
		},
		{
			name: "fail_over_reserve",
			a:    llmretry.Attempt{Model: "a", Try: 3, Kind: llmretry.KindTransient, Status: 503, Err: errors.New("busy"), Start: start, Next: llmretry.NextFailOver, Why: llmretry.WhyReserve},
			want: map[string]any{"retry_after_ms": absent{}, "next": "fail_over", "why": "reserve"},
		},
		{
			name: "stop_max_wait_keeps_hint",
			a: llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 429, Err: errors.New("slow down"), Start: start,
				RetryAfter: time.Hour, Next: llmretry.NextStop, Why: llmretry.WhyMaxWait},
			want: map[string]any{"retry_after_ms": json.Number("3600000"), "next": "stop", "why": "max_wait"},
		},
		{
			name: "success",
			a:    llmretry.Attempt{Backend: 1, Model: "b", Try: 1, Start: start, Elapsed: 250 * time.Microsecond},
			want: map[string]any{
				"kind": absent{}, "error": absent{}, "next": absent{}, "why": absent{}, "retry_after_ms": absent{},
				"elapsed_ms": json.Number("0.25"), "model": "b",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tc.a)
			if err != nil {
				t.Fatalf("json.Marshal() error = %v", err)
			}
			checkKeys(t, decodeNumbers(t, b), tc.want)
		})
	}
}

// json.Marshal of any of the four error types gives the record a
// dead-letter table keeps.
func TestErrorJSONDeadLetter(t *testing.T) {
	errTurnBudget := errors.New("turn budget spent")
	tests := []struct {
		name      string
		run       func(t *testing.T) error // in a bubble
		wantType  string
		wantKeys  map[string]any
		wantCause bool
	}{
		{
			name: "exhausted_rejected",
			run: func(t *testing.T) error {
				c := &chain{Backends: []backend{
					{Model: "a", Call: newFake("a", always(llmretry.StatusFailure(400, nil, errors.New("too long")))).Call},
					{Model: "b", Call: newFake("b", always(llmretry.StatusFailure(403, nil, errors.New("policy")))).Call},
				}}
				_, err := c.Do(context.Background(), "hi")
				return err
			},
			wantType: "*llmretry.Exhausted",
			wantKeys: map[string]any{"outcome": "exhausted", "item_retryable": false, "cause": absent{}},
		},
		{
			name: "exhausted_transient",
			run: func(t *testing.T) error {
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", always(busy("busy"))).Call}}}
				_, err := c.Do(context.Background(), "hi")
				return err
			},
			wantType: "*llmretry.Exhausted",
			wantKeys: map[string]any{"outcome": "exhausted", "item_retryable": true, "cause": absent{}},
		},
		{
			name: "truncated",
			run: func(t *testing.T) error {
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", always(llmretry.Truncation("part"))).Call}}}
				_, err := c.Do(context.Background(), "hi")
				return err
			},
			wantType: "*llmretry.Truncated",
			wantKeys: map[string]any{"outcome": "truncated", "item_retryable": false, "cause": absent{}},
		},
		{
			name: "timed_out_with_cause",
			run: func(t *testing.T) error {
				ctx, cancel := context.WithTimeoutCause(context.Background(), time.Second, errTurnBudget)
				defer cancel()
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", hang).Call}}}
				_, err := c.Do(ctx, "hi")
				return err
			},
			wantType: "*llmretry.TimedOut",
			wantKeys: map[string]any{"outcome": "timed_out", "item_retryable": true, "cause": "turn budget spent"},
		},
		{
			name: "timed_out_plain",
			run: func(t *testing.T) error {
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", hang).Call, Timeout: time.Second}}}
				_, err := c.Do(context.Background(), "hi")
				return err
			},
			wantType: "*llmretry.TimedOut",
			wantKeys: map[string]any{"outcome": "timed_out", "item_retryable": true, "cause": absent{}},
		},
		{
			name: "cancelled_mid_call",
			run: func(t *testing.T) error {
				ctx, cancel := context.WithCancelCause(context.Background())
				time.AfterFunc(time.Second, func() { cancel(errors.New("user left")) })
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", hang).Call}}}
				_, err := c.Do(ctx, "hi")
				return err
			},
			wantType: "*llmretry.Cancelled",
			wantKeys: map[string]any{"outcome": "cancelled", "item_retryable": true, "cause": "user left"},
		},
		{
			name: "cancelled_before_any_attempt",
			run: func(t *testing.T) error {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", answers).Call}}}
				_, err := c.Do(ctx, "hi")
				return err
			},
			wantType: "*llmretry.Cancelled",
			wantKeys: map[string]any{"outcome": "cancelled", "item_retryable": true, "attempts": []any{}, "cause": "context canceled"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				err := tc.run(t)
				if got := typeName(err); got != tc.wantType {
					t.Fatalf("Do() = %v (%s), want a %s", err, got, tc.wantType)
				}
				b, jerr := json.Marshal(err) // as a dead-letter writer would, on the error value
				if jerr != nil {
					t.Fatalf("json.Marshal(err) error = %v", jerr)
				}
				var m map[string]any
				if jerr := json.Unmarshal(b, &m); jerr != nil {
					t.Fatalf("decoding %s: %v", b, jerr)
				}
				keys := map[string]bool{"outcome": true, "item_retryable": true, "error": true, "attempts": true, "usage_unknown": true}
				if _, ok := tc.wantKeys["cause"].(string); ok {
					keys["cause"] = true
				}
				for k := range m {
					if !keys[k] {
						t.Errorf("json.Marshal(err) has key %q, want only %v", k, keys)
					}
				}
				checkKeys(t, m, tc.wantKeys)
				if got := m["error"]; got != err.Error() {
					t.Errorf("error = %q, want Error() = %q", got, err.Error())
				}
				// attempts holds each record as Attempt marshals it.
				attempts, aerr := json.Marshal(recordsOf(t, err))
				if aerr != nil {
					t.Fatal(aerr)
				}
				var want []any
				if aerr := json.Unmarshal(attempts, &want); aerr != nil {
					t.Fatal(aerr)
				}
				if want == nil {
					want = []any{}
				}
				if diff := cmp.Diff(want, m["attempts"]); diff != "" {
					t.Errorf("attempts (-want +got):\n%s", diff)
				}
				if got := m["item_retryable"]; got != llmretry.RetryItem(err) {
					t.Errorf("item_retryable = %v, want RetryItem() = %t", got, llmretry.RetryItem(err))
				}
			})
		})
	}
}

func typeName(err error) string {
	switch err.(type) {
	case *llmretry.Truncated:
		return "*llmretry.Truncated"
	case *llmretry.TimedOut:
		return "*llmretry.TimedOut"
	case *llmretry.Exhausted:
		return "*llmretry.Exhausted"
	case *llmretry.Cancelled:
		return "*llmretry.Cancelled"
	case nil:
		return "nil"
	}
	return "other"
}

// slog output gives durations in milliseconds, as the JSON does, and a
// success says no kind.
func TestLogValuesInMilliseconds(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	failed := llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 429, Err: errors.New("slow down"),
		Elapsed: 1500 * time.Microsecond, RetryAfter: 2 * time.Second, Next: llmretry.NextRetry, RetryIn: 2500 * ms}
	stopped := llmretry.Attempt{Model: "a", Try: 2, Kind: llmretry.KindTransient, Status: 503, Err: errors.New("busy"),
		Elapsed: 250 * time.Microsecond, Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed}
	success := llmretry.Attempt{Backend: 1, Model: "b", Try: 1, Elapsed: 3 * ms}
	err := llmretry.Exhaust([]llmretry.Attempt{failed, stopped})

	logger.Info("attempt", "a", failed)
	logger.Info("attempt", "a", success)
	logger.Info("failed", "err", err)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("log = %q, want 3 lines", buf.String())
	}
	group := func(line string, path ...string) map[string]any {
		t.Helper()
		m := decodeNumbers(t, []byte(line))
		for _, p := range path {
			g, ok := m[p].(map[string]any)
			if !ok {
				t.Fatalf("log line %s has no group %q", line, p)
			}
			m = g
		}
		return m
	}
	checkKeys(t, group(lines[0], "a"), map[string]any{
		"elapsed_ms": json.Number("1.5"), "retry_after_ms": json.Number("2000"), "retry_in_ms": json.Number("2500"),
		"next": "retry", "kind": "transient", "elapsed": absent{}, "retry_in": absent{},
	})
	checkKeys(t, group(lines[1], "a"), map[string]any{"elapsed_ms": json.Number("3"), "kind": absent{}, "error": absent{}, "next": absent{}})
	checkKeys(t, group(lines[2], "err"), map[string]any{"outcome": "exhausted", "item_retryable": true})
	checkKeys(t, group(lines[2], "err", "records", "1"), map[string]any{
		"elapsed_ms": json.Number("0.25"), "next": "stop", "why": "waits_used", "retry_after_ms": absent{},
	})
}

// A retry after a zero wait says so: RetryIn alone is 0 for "at once" and
// for "not retried".
func TestDoZeroWaitRetrySaysRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newFake("a", always(busy("busy")))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(0)}}}

		_, err := c.Do(context.Background(), "hi")
		attempts := exhausted(t, err)
		var got []string
		for _, at := range attempts {
			b, err := json.Marshal(at)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprintf("next=%v why=%v retry_in_ms=%v", m["next"], m["why"], m["retry_in_ms"]))
		}
		want := []string{
			"next=retry why=<nil> retry_in_ms=0",
			"next=stop why=waits_used retry_in_ms=0",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
	})
}
