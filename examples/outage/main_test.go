package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRun plays the whole demo over loopback, as go run does, and checks
// what a newcomer is told: the timeline in order, the answer, the
// dead-letter record, and no API key anywhere. It takes about as long as
// the demo, a little over a second, most of it the server's retry-after.
func TestRun(t *testing.T) {
	var buf bytes.Buffer
	if err := run(&buf); err != nil {
		t.Fatalf("run() = %v, want nil; output:\n%s", err, buf.String())
	}
	out := buf.String()

	// The rows of part 1, in order: the primary's outage as the chain saw
	// it, then the fallback. Each pattern must match after the previous
	// one; the first group is the row's time.
	row := func(backend, model, try, kind, status, next, wait, err string) string {
		return `(?m)^\s+([0-9.]+)s\s+` + backend + `\s+` + model + `\s+` + try + `\s+` + kind + `\s+` +
			status + `\s+` + next + `\s+` + wait + `\s+` + err
	}
	tests := []struct {
		name    string
		pattern string
	}{
		{"503_retried", row("0 primary", "gpt-4o", "1", "transient", "503", "retry", "50ms", `http 503: `)},
		{"503_again", row("0 primary", "gpt-4o", "2", "transient", "503", "retry", "100ms", `http 503: `)},
		{"429_retry_after", row("0 primary", "gpt-4o", "3", "transient", "429", "retry", "1s", `http 429: `)},
		{"down_eof", row("0 primary", "gpt-4o", "4", "transient", "-", "retry", "200ms", `Post "[^"]*\?key=REDACTED": EOF`)},
		{"refused", row("0 primary", "gpt-4o", "5", "transient", "-", "fail_over/waits_used", "-", `Post "[^"]*\?key=REDACTED": .*connection refused`)},
		{"truncated", row("1 secondary", "claude-sonnet-4-5", "1", "truncated", "-", "fail_over/not_retryable", "-", `truncated \(raw text kept: "Without jitter`)},
		{"answered", row("2 secondary", "claude-sonnet-4-5", "1", "ok", "-", "-", "-", "-")},
		{"answer", `(?m)^  Without jitter, clients that failed together retry together, .*instant\.$`},
		{"server_log", `primary    4 requests: status 503, status 503, status 429, down\n.*1 more from the chain, refused`},
		{"part_2", `== Part 2`},
		{"error_text", `(?m)^  llmretry: truncated after 7 attempts on 3 backends: raise the completion budget`},
		{"advice", `llmretry.RetryItem\(err\): false`},
		{"record", `"outcome": "truncated",\n  "item_retryable": false,`},
		// The refused attempts reached no provider, and the truncated
		// answers reported what they were billed: no cost is unknown.
		{"usage", `"usage": \{\n    "input_tokens": 20,\n    "output_tokens": 16\n  \},\n  "usage_unknown": 0,`},
	}
	rest, offset := out, 0
	var times []float64
	for _, tc := range tests {
		loc := regexp.MustCompile(tc.pattern).FindStringSubmatchIndex(rest)
		if loc == nil {
			t.Fatalf("%s: no match for %q after offset %d; output:\n%s", tc.name, tc.pattern, offset, out)
		}
		if len(loc) > 2 && loc[2] >= 0 {
			sec, err := strconv.ParseFloat(rest[loc[2]:loc[3]], 64)
			if err != nil {
				t.Fatalf("%s: time %q: %v", tc.name, rest[loc[2]:loc[3]], err)
			}
			times = append(times, sec)
		}
		rest, offset = rest[loc[1]:], offset+loc[1]
	}

	// Each retry is sent no sooner than its wait after the previous
	// attempt was sent: these lower bounds hold however slow the machine.
	// The third wait is the server's retry-after of one second, which
	// replaced the policy's 200ms.
	waits := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, time.Second, 200 * time.Millisecond}
	for i, w := range waits {
		// Times are printed to the millisecond, rounded.
		if gap := time.Duration((times[i+1] - times[i]) * float64(time.Second)); gap < w-time.Millisecond {
			t.Errorf("try %d sent %v after try %d, want at least %v", i+2, gap, i+1, w)
		}
	}

	// The key sits in the primary's URL, which net/http's errors quote;
	// it must show nowhere, in the table, the error or the record.
	if strings.Contains(out, "sk-test") {
		t.Errorf("output contains the API key (sk-test...); output:\n%s", out)
	}
}
