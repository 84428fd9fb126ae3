package llmretry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// Each record carries what its attempt cost: the last report of the
// Call, or the Usage of the Failure it returned, which wins; an attempt
// that reported nothing has none (unknown, not zero).
func TestAttemptUsage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		billed := &llmretry.Usage{InputTokens: 100, OutputTokens: 50}
		a := newFake("a", func(ctx context.Context, n int) error {
			switch n {
			case 1: // a stream cut after its usage event
				llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 1, OutputTokens: 1})
				llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 100, OutputTokens: 7})
				return busy("cut")
			case 2: // a truncation is billed in full
				llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 9, OutputTokens: 9})
				f := llmretry.Truncation("partial")
				f.Usage = billed
				return f
			}
			return nil
		})
		b := newFake("b", func(ctx context.Context, n int) error {
			if n == 1 {
				return context.DeadlineExceeded // nothing reported: unknown
			}
			llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 100, OutputTokens: 20, CachedInputTokens: 80, ReasoningTokens: 5})
			return nil
		})
		rec := newRecorder()
		c := &chain{
			Backends: []backend{
				{Model: "a", Call: a.Call, Retry: waits(0)},
				{Model: "b", Call: b.Call, Retry: waits(0)},
			},
			OnAttempt: rec.OnAttempt,
		}
		if _, err := c.Do(context.Background(), "hi"); err != nil {
			t.Fatalf("Do() error = %v", err)
		}
		seen, _ := rec.seen()
		var got []*llmretry.Usage
		for _, a := range seen {
			got = append(got, a.Usage)
		}
		want := []*llmretry.Usage{
			{InputTokens: 100, OutputTokens: 7},
			{InputTokens: 100, OutputTokens: 50},
			nil,
			{InputTokens: 100, OutputTokens: 20, CachedInputTokens: 80, ReasoningTokens: 5},
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("records' usage differs (-want +got):\n%s", d)
		}
		billed.InputTokens = 0
		if seen[1].Usage.InputTokens != 100 {
			t.Errorf("record's usage changed with the backend's Failure: the record must keep its own copy")
		}
		total, unknown := llmretry.TotalUsage(seen)
		if d := cmp.Diff(llmretry.Usage{InputTokens: 300, OutputTokens: 77, CachedInputTokens: 80, ReasoningTokens: 5}, total); d != "" || unknown != 1 {
			t.Errorf("TotalUsage = %+v, %d unknown; want (-want +got):\n%s, 1 unknown", total, unknown, d)
		}
	})
}

// Usage is in an attempt's JSON and slog value only when known, and the
// error's JSON gives the total and the count of unknown costs.
func TestUsageEncoding(t *testing.T) {
	u := &llmretry.Usage{InputTokens: 12, OutputTokens: 3}
	a := llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTruncated, Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable, Usage: u}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"usage":{"input_tokens":12,"output_tokens":3}`) {
		t.Errorf("json = %s, want usage with input and output tokens and no zero extras", b)
	}
	var back llmretry.Attempt
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(u, back.Usage); d != "" {
		t.Errorf("usage after a round trip differs (-want +got):\n%s", d)
	}
	if err := json.Unmarshal([]byte(`{"usage":7}`), &back); err == nil || !strings.Contains(err.Error(), `"usage"`) {
		t.Errorf("decoding usage 7: error = %v, want one naming the field", err)
	}
	a.Usage = nil
	b, _ = json.Marshal(a)
	if strings.Contains(string(b), "usage") {
		t.Errorf("json = %s, want no usage key when unknown", b)
	}

	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "attempt", llmretry.Attempt{Model: "a", Try: 1, Usage: &llmretry.Usage{InputTokens: 4, OutputTokens: 2, ReasoningTokens: 1}})
	if !strings.Contains(logs.String(), `"usage":{"input_tokens":4,"output_tokens":2,"reasoning_tokens":1}`) {
		t.Errorf("slog = %s, want the usage group", logs.String())
	}

	timedOut := llmretry.Attempt{Model: "b", Try: 1, Kind: llmretry.KindTimeout, Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed, Start: time.Unix(0, 0).UTC()}
	rejected := llmretry.Attempt{Model: "c", Try: 1, Kind: llmretry.KindRejected, Status: 400, Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable, Start: time.Unix(0, 0).UTC()}
	truncated := llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTruncated, Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable, Usage: u, Start: time.Unix(0, 0).UTC()}
	err = &llmretry.Exhausted{Attempts: []llmretry.Attempt{truncated, truncated, timedOut, rejected}}
	b, _ = json.Marshal(err)
	var rec struct {
		Usage        *llmretry.Usage `json:"usage"`
		UsageUnknown int             `json:"usage_unknown"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&llmretry.Usage{InputTokens: 24, OutputTokens: 6}, rec.Usage); d != "" || rec.UsageUnknown != 1 {
		t.Errorf("error json usage %+v, unknown %d; want 24/6 and 1 unknown (the timeout, not the 400):\n%s", rec.Usage, rec.UsageUnknown, d)
	}
	b, _ = json.Marshal(&llmretry.Exhausted{Attempts: []llmretry.Attempt{rejected}})
	if strings.Contains(string(b), `"usage":`) {
		t.Errorf("json = %s, want no usage total when no attempt carries one", b)
	}
}

// An inner chain's records are what the outer attempt that ran it cost.
func TestNestedUsage(t *testing.T) {
	inner := &chain{Backends: []backend{{Model: "in", Call: func(ctx context.Context, req string) (string, error) {
		f := llmretry.Truncation("cut")
		f.Usage = &llmretry.Usage{InputTokens: 5, OutputTokens: 5}
		return "", f
	}}}}
	rec := newRecorder()
	outer := &chain{
		Backends:  []backend{{Model: "out", Call: inner.Do}, {Model: "next", Call: newFake("next", answers).Call}},
		OnAttempt: rec.OnAttempt,
	}
	if _, err := outer.Do(context.Background(), "hi"); err != nil {
		t.Fatalf("Do() error = %v", err)
	}
	seen, _ := rec.seen()
	if d := cmp.Diff(&llmretry.Usage{InputTokens: 5, OutputTokens: 5}, seen[0].Usage); d != "" {
		t.Errorf("outer record's usage differs (-want +got):\n%s", d)
	}
}

// A nested chain that answers reports what all its attempts cost to the
// outer attempt that ran it, so the outer record's cost is known.
func TestNestedSuccessUsage(t *testing.T) {
	calls := 0
	inner := &chain{Backends: []backend{{Model: "in", Retry: waits(0), Call: func(ctx context.Context, req string) (string, error) {
		calls++
		if calls == 1 {
			f := llmretry.ParseFailure("{", nil)
			f.Usage = &llmretry.Usage{InputTokens: 5, OutputTokens: 1}
			return "", f
		}
		llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 5, OutputTokens: 2})
		return "ok", nil
	}}}}
	rec := newRecorder()
	outer := &chain{Backends: []backend{{Model: "out", Call: inner.Do}}, OnAttempt: rec.OnAttempt}
	if _, err := outer.Do(context.Background(), "hi"); err != nil {
		t.Fatalf("Do() error = %v", err)
	}
	seen, _ := rec.seen()
	if d := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 3}, seen[0].Usage); d != "" {
		t.Errorf("outer record's usage differs (-want +got):\n%s", d)
	}
	if _, unknown := llmretry.TotalUsage(seen); unknown != 0 {
		t.Errorf("TotalUsage counts %d unknown, want 0: the inner chain reported its cost", unknown)
	}
}

// A Call that runs inner chains is charged for every one of them, on top
// of its own last report: inner calls add, a Call's own reports replace
// one another, and a chain run under Standalone is charged to no one.
func TestNestedUsageAddsUp(t *testing.T) {
	u := func(in, out int64) *llmretry.Usage { return &llmretry.Usage{InputTokens: in, OutputTokens: out} }
	tenOne := func(ctx context.Context, req string) (string, error) {
		llmretry.ReportUsage(ctx, *u(10, 1))
		return "ok", nil
	}
	failTenOne := func(ctx context.Context, req string) (string, error) {
		f := busy("inner down")
		f.Usage = u(10, 1)
		return "", f
	}
	answering := &chain{Backends: []backend{{Model: "in", Call: tenOne}}}
	failing := &chain{Backends: []backend{{Model: "in", Call: failTenOne}}}
	tests := []struct {
		name string
		call func(ctx context.Context, req string) (string, error)
		want *llmretry.Usage
	}{
		{
			name: "two_inner_calls",
			call: func(ctx context.Context, req string) (string, error) {
				if _, err := answering.Do(ctx, req); err != nil {
					return "", err
				}
				return answering.Do(ctx, req)
			},
			want: u(20, 2),
		},
		{
			name: "failed_then_answered",
			call: func(ctx context.Context, req string) (string, error) {
				if _, err := failing.Do(ctx, req); err == nil {
					return "", errors.New("inner chain answered, want its failure")
				}
				return answering.Do(ctx, req)
			},
			want: u(20, 2),
		},
		{
			name: "answered_then_failed",
			call: func(ctx context.Context, req string) (string, error) {
				if _, err := answering.Do(ctx, req); err != nil {
					return "", err
				}
				return failing.Do(ctx, req) // its error is the record's; its cost counted once
			},
			want: u(20, 2),
		},
		{
			name: "own_reports_replace_inner_add",
			call: func(ctx context.Context, req string) (string, error) {
				llmretry.ReportUsage(ctx, *u(3, 0)) // a stream's running total...
				answering.Do(ctx, req)
				llmretry.ReportUsage(ctx, *u(5, 2)) // ...replaced by its final one
				return answering.Do(ctx, req)
			},
			want: u(25, 4),
		},
		{
			name: "standalone_not_charged",
			call: func(ctx context.Context, req string) (string, error) {
				answering.Do(llmretry.Standalone(ctx), req)
				return answering.Do(ctx, req)
			},
			want: u(10, 1),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			outer := &chain{Backends: []backend{{Model: "out", Call: tc.call}}, OnAttempt: rec.OnAttempt}
			_, err := outer.Do(context.Background(), "hi")
			seen, _ := rec.seen()
			if len(seen) != 1 {
				t.Fatalf("Do() = %v with %d records, want one", err, len(seen))
			}
			if d := cmp.Diff(tc.want, seen[0].Usage); d != "" {
				t.Errorf("outer record's usage differs (-want +got):\n%s", d)
			}
		})
	}
}

// Chains nested three deep charge each level once: the outermost record
// holds what every innermost call cost, and the error's total is not
// doubled by the inner error it carries.
func TestNestedUsageThreeDeep(t *testing.T) {
	innermost := &chain{Backends: []backend{{Model: "c", Call: func(ctx context.Context, req string) (string, error) {
		f := busy("down")
		f.Usage = &llmretry.Usage{InputTokens: 10, OutputTokens: 1}
		return "", f
	}}}}
	middle := &chain{Backends: []backend{{Model: "b", Call: func(ctx context.Context, req string) (string, error) {
		innermost.Do(ctx, req)
		return innermost.Do(ctx, req)
	}}}}
	outer := &chain{Backends: []backend{{Model: "a", Call: func(ctx context.Context, req string) (string, error) {
		middle.Do(ctx, req)
		return middle.Do(ctx, req)
	}}}}
	_, err := outer.Do(context.Background(), "hi")
	var ex *llmretry.Exhausted
	if !errors.As(err, &ex) || len(ex.Attempts) != 1 {
		t.Fatalf("Do() = %v, want an Exhausted with one record", err)
	}
	want := &llmretry.Usage{InputTokens: 40, OutputTokens: 4}
	if d := cmp.Diff(want, ex.Attempts[0].Usage); d != "" {
		t.Errorf("outer record's usage differs (-want +got):\n%s", d)
	}
	var rec struct {
		Usage *llmretry.Usage `json:"usage"`
	}
	b, _ := json.Marshal(err)
	if jerr := json.Unmarshal(b, &rec); jerr != nil {
		t.Fatal(jerr)
	}
	if d := cmp.Diff(want, rec.Usage); d != "" {
		t.Errorf("error JSON's usage differs (-want +got):\n%s", d)
	}
}

// An attempt whose request never reached the provider has a known cost of
// zero; one that may have reached it, and reported nothing, is unknown.
func TestUsageOfRequestsNeverSent(t *testing.T) {
	refusedDial := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	post := func(err error) error { return &url.Error{Op: "Post", URL: "https://api.example.com/v1", Err: err} }
	tests := []struct {
		name string
		err  error
		sent bool // the request may have reached the provider: its cost is unknown
	}{
		{name: "refused", err: post(refusedDial)},
		{name: "dial_timeout", err: post(&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded})},
		{name: "no_such_host", err: post(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "api.example.com", IsNotFound: true}})},
		{name: "dns_bare", err: &net.DNSError{Err: "server misbehaving", Name: "api.example.com", IsTemporary: true}},
		{name: "proxy_down", err: post(&net.OpError{Op: "proxyconnect", Net: "tcp", Err: syscall.ECONNREFUSED})},
		{name: "errno_bare", err: fmt.Errorf("connect: %w", syscall.ECONNREFUSED)},
		{name: "in_a_failure", err: &llmretry.Failure{Kind: llmretry.KindTransient, Err: post(refusedDial)}},
		{name: "both_tries_refused", err: errors.Join(post(refusedDial), post(refusedDial))},
		{name: "reset_after_send", err: post(&net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}), sent: true},
		{name: "refused_then_reset", err: errors.Join(post(refusedDial), post(&net.OpError{Op: "read", Err: syscall.ECONNRESET})), sent: true},
		{name: "eof", err: post(io.EOF), sent: true},
		{name: "timeout", err: context.DeadlineExceeded, sent: true},
		{name: "read_refused", err: &net.OpError{Op: "read", Err: syscall.ECONNREFUSED}, sent: true},
		{name: "inner_chain_refused", err: &llmretry.Exhausted{Attempts: []llmretry.Attempt{{Err: post(refusedDial), Kind: llmretry.KindTransient}}}, sent: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &chain{Backends: []backend{{Model: "m", Call: func(context.Context, string) (string, error) { return "", tc.err }}}}
			_, err := c.Do(context.Background(), "hi")
			var ex *llmretry.Exhausted
			if !errors.As(err, &ex) || len(ex.Attempts) != 1 {
				t.Fatalf("Do() = %v, want an Exhausted with one record", err)
			}
			var want *llmretry.Usage
			if !tc.sent {
				want = &llmretry.Usage{}
			}
			if d := cmp.Diff(want, ex.Attempts[0].Usage); d != "" {
				t.Errorf("record's usage differs (-want +got):\n%s", d)
			}
			if _, unknown := llmretry.TotalUsage(ex.Attempts); unknown != map[bool]int{true: 1}[tc.sent] {
				t.Errorf("TotalUsage() unknown = %d, want %d", unknown, map[bool]int{true: 1}[tc.sent])
			}
		})
	}
}

// Three providers down, their connections refused: the error's record
// counts no attempt of unknown cost, since none reached a provider. A
// provider that hung up after reading the request still counts.
func TestUsageUnknownOfProvidersDown(t *testing.T) {
	down := func() string {
		t.Helper()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l.Close() // nothing listens there now: connections are refused
		return "http://" + l.Addr().String()
	}
	// Reads the request whole, then drops the connection unanswered.
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer hangUp.Close()

	const guard = 10 * time.Second // should something else take a port
	backends := func(urls ...string) []backend {
		var bs []backend
		for i, u := range urls {
			bs = append(bs, backend{Model: fmt.Sprintf("p%d", i), Call: httpCall(u), Timeout: guard, Retry: waits(0, 0)})
		}
		return bs
	}
	tests := []struct {
		name        string
		urls        []string
		wantUnknown int
	}{
		{name: "three_down", urls: []string{down(), down(), down()}, wantUnknown: 0},
		{name: "two_down_one_hung_up", urls: []string{down(), down(), hangUp.URL}, wantUnknown: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &chain{Backends: backends(tc.urls...)}
			_, err := c.Do(context.Background(), "hi")
			var ex *llmretry.Exhausted
			if !errors.As(err, &ex) || len(ex.Attempts) != 9 {
				t.Fatalf("Do() = %v, want an Exhausted with 9 records", err)
			}
			var rec struct {
				Usage        *llmretry.Usage `json:"usage"`
				UsageUnknown *int            `json:"usage_unknown"`
			}
			if jerr := json.Unmarshal([]byte(mustJSON(t, err)), &rec); jerr != nil {
				t.Fatal(jerr)
			}
			if rec.UsageUnknown == nil || *rec.UsageUnknown != tc.wantUnknown {
				t.Errorf("usage_unknown = %v, want %d; record %s", rec.UsageUnknown, tc.wantUnknown, mustJSON(t, err))
			}
			if d := cmp.Diff(&llmretry.Usage{}, rec.Usage); d != "" {
				t.Errorf("usage differs (-want +got):\n%s", d)
			}
			if strings.Contains(slogJSON(err), `"usage_unknown"`) != (tc.wantUnknown > 0) {
				t.Errorf("slog = %s, want usage_unknown only when there are attempts of unknown cost", slogJSON(err))
			}
		})
	}
}

// A timed-out attempt may have been billed: its cost is unknown.
func TestUsageUnknownOfTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hung := func(ctx context.Context, _ string) (string, error) {
			<-ctx.Done()
			return "", ctx.Err()
		}
		c := &chain{Backends: []backend{{Model: "m", Call: hung, Timeout: time.Second}}}
		_, err := c.Do(context.Background(), "hi")
		var rec struct {
			Usage        *llmretry.Usage `json:"usage"`
			UsageUnknown int             `json:"usage_unknown"`
		}
		if jerr := json.Unmarshal([]byte(mustJSON(t, err)), &rec); jerr != nil {
			t.Fatal(jerr)
		}
		if rec.UsageUnknown != 1 || rec.Usage != nil {
			t.Errorf("usage %v, usage_unknown %d; want no usage and 1 unknown", rec.Usage, rec.UsageUnknown)
		}
	})
}

// The estimate of a request's input tokens: a token for every four bytes
// of its text, rounded up, and four a message.
func TestEstimateInputTokens(t *testing.T) {
	tests := []struct {
		bytes, messages int
		want            int64
	}{
		{0, 0, 0},
		{1, 0, 1},
		{4, 0, 1},
		{5, 0, 2},
		{14, 1, 4 + 4},     // "You are terse."
		{400, 3, 100 + 12}, // three messages of text in all 400 bytes
	}
	for _, tc := range tests {
		if got := llmretry.EstimateInputTokens(tc.bytes, tc.messages); got != tc.want {
			t.Errorf("EstimateInputTokens(%d, %d) = %d, want %d", tc.bytes, tc.messages, got, tc.want)
		}
	}
}
