package llmretrytest

import (
	"bytes"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// fakeClock is a clock a test moves by hand, so that refill is tested
// without waiting and without reading the wall clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// clockT0 is the fake clock's start, on a whole second so that
// Anthropic's resets, rounded up to the second, read exactly.
var clockT0 = time.Date(2026, 12, 2, 4, 30, 0, 0, time.UTC)

// limitedServer starts a server whose clock is a fakeClock at clockT0.
func limitedServer(t *testing.T) (*Server, *fakeClock) {
	t.Helper()
	s := newServer(t)
	clk := &fakeClock{t: clockT0}
	s.mu.Lock()
	s.now = clk.Now
	s.mu.Unlock()
	return s, clk
}

// rateLimitKeys are the headers a bucket's readings come in, by API.
var rateLimitKeys = map[string][]string{
	"openai": {
		"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
		"Retry-After", "Retry-After-Ms",
	},
	"anthropic": {
		"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset",
		"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset",
		"Retry-After", "Retry-After-Ms",
	},
}

// limitHeaders are the rate-limit headers of a response, by key; absent
// keys are left out.
func limitHeaders(api string, h http.Header) map[string]string {
	got := map[string]string{}
	for _, k := range rateLimitKeys[api] {
		if v := h.Values(k); len(v) > 0 {
			got[k] = v[0]
			if len(v) > 1 {
				got[k] += " (and more)"
			}
		}
	}
	return got
}

// Each response says how the buckets stand once the request has paid:
// limit the Burst, remaining the whole units left, reset the time until
// full, in each provider's form; streams and JSON alike.
func TestLimitHeaders(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		s, _ := limitedServer(t)
		s.Script("m", Answer("one two three"))
		// 1 request a second, burst 3; 100 tokens a second, burst 1000.
		s.Limit("m", Limits{Requests: Bucket{Rate: 1, Burst: 3}, Tokens: Bucket{Rate: 100, Burst: 1000}})
		c := newClient(t)

		got := call(t, c, s, "openai", "m", stream)
		if got.err != nil || got.status() != 200 {
			t.Fatalf("stream=%v: openai: status %d, err %v; want 200", stream, got.status(), got.err)
		}
		// The answer costs 10 input and 3 output tokens: 13, back in 130 ms.
		want := map[string]string{
			"X-Ratelimit-Limit-Requests":     "3",
			"X-Ratelimit-Remaining-Requests": "2",
			"X-Ratelimit-Reset-Requests":     "1s",
			"X-Ratelimit-Limit-Tokens":       "1000",
			"X-Ratelimit-Remaining-Tokens":   "987",
			"X-Ratelimit-Reset-Tokens":       "130ms",
		}
		if diff := cmp.Diff(want, limitHeaders("openai", got.resp.Header)); diff != "" {
			t.Errorf("stream=%v: openai headers (-want +got):\n%s", stream, diff)
		}

		// The same buckets, read from the Anthropic endpoint: full again
		// at a time, rounded up to the second.
		got = call(t, c, s, "anthropic", "m", stream)
		if got.err != nil || got.status() != 200 {
			t.Fatalf("stream=%v: anthropic: status %d, err %v; want 200", stream, got.status(), got.err)
		}
		want = map[string]string{
			"Anthropic-Ratelimit-Requests-Limit":     "3",
			"Anthropic-Ratelimit-Requests-Remaining": "1",
			"Anthropic-Ratelimit-Requests-Reset":     "2026-12-02T04:30:02Z",
			"Anthropic-Ratelimit-Tokens-Limit":       "1000",
			"Anthropic-Ratelimit-Tokens-Remaining":   "974",
			"Anthropic-Ratelimit-Tokens-Reset":       "2026-12-02T04:30:01Z", // 260 ms, rounded up
		}
		if diff := cmp.Diff(want, limitHeaders("anthropic", got.resp.Header)); diff != "" {
			t.Errorf("stream=%v: anthropic headers (-want +got):\n%s", stream, diff)
		}
	}
}

// A request the bucket cannot pay for gets a 429 with retry-after and the
// headers, is logged as such, and does not use up a step of the script;
// as time passes the bucket refills, up to its Burst and no further.
func TestLimitRefusesAndRefills(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"openai", "anthropic"} {
		s, clk := limitedServer(t)
		s.Script("m", Answer("one"), Answer("two"), Answer("three"))
		s.Limit("m", Limits{Requests: Bucket{Rate: 2, Burst: 2}}) // a request every 500 ms
		c := newClient(t)
		type seen struct {
			Status    int
			Remaining string
			Reset     string
			After     string // retry-after
			AfterMs   string // retry-after-ms, OpenAI's only
		}
		check := func(what string, want seen) {
			t.Helper()
			got := call(t, c, s, api, "m", false)
			if got.err != nil {
				t.Fatalf("%s %s: err %v", api, what, got.err)
			}
			h := got.resp.Header
			g := seen{Status: got.status(), After: h.Get("Retry-After"), AfterMs: h.Get("Retry-After-Ms")}
			if api == "openai" {
				g.Remaining, g.Reset = h.Get("X-Ratelimit-Remaining-Requests"), h.Get("X-Ratelimit-Reset-Requests")
			} else {
				g.Remaining, g.Reset = h.Get("Anthropic-Ratelimit-Requests-Remaining"), h.Get("Anthropic-Ratelimit-Requests-Reset")
			}
			if api == "anthropic" {
				want.AfterMs = ""
			}
			if diff := cmp.Diff(want, g); diff != "" {
				t.Errorf("%s %s (-want +got):\n%s", api, what, diff)
			}
		}
		reset := func(openai string, anthropic time.Duration) string {
			if api == "openai" {
				return openai
			}
			full := clk.Now().Add(anthropic) // rounded up to the second, as the server sends it
			if t := full.Truncate(time.Second); !t.Equal(full) {
				full = t.Add(time.Second)
			}
			return full.Format(time.RFC3339)
		}
		check("first", seen{Status: 200, Remaining: "1", Reset: reset("500ms", 500*time.Millisecond)})
		check("second", seen{Status: 200, Remaining: "0", Reset: reset("1s", time.Second)})
		check("over the rate", seen{Status: 429, Remaining: "0", Reset: reset("1s", time.Second), After: "1", AfterMs: "500"})
		clk.Advance(300 * time.Millisecond)
		check("not yet refilled", seen{Status: 429, Remaining: "0", Reset: reset("700ms", 700*time.Millisecond), After: "1", AfterMs: "200"})
		clk.Advance(200 * time.Millisecond)
		check("refilled one", seen{Status: 200, Remaining: "0", Reset: reset("1s", time.Second)})
		clk.Advance(time.Hour)
		check("refilled to the burst", seen{Status: 200, Remaining: "1", Reset: reset("500ms", 500*time.Millisecond)})

		want := []Request{
			{Model: "m", API: api, N: 1, Step: "answer"},
			{Model: "m", API: api, N: 2, Step: "answer"},
			{Model: "m", API: api, N: 3, Step: "status 429 requests"},
			{Model: "m", API: api, N: 4, Step: "status 429 requests"},
			{Model: "m", API: api, N: 5, Step: "answer"},
			{Model: "m", API: api, N: 6, Step: "answer"},
		}
		if diff := cmp.Diff(want, s.Requests(), cmpopts.IgnoreFields(Request{}, "Time", "Header", "Usage")); diff != "" {
			t.Errorf("%s: Requests() (-want +got):\n%s", api, diff)
		}
	}
}

// The refusals did not use up the script: the request after them plays the
// step the first refused one would have played.
func TestLimitRefusalKeepsScript(t *testing.T) {
	t.Parallel()
	s, clk := limitedServer(t)
	s.Script("m", Answer("one"), Answer("two"), Answer("three"))
	s.Limit("m", Limits{Requests: Bucket{Rate: 1, Burst: 1}})
	c := newClient(t)
	for i, want := range []struct {
		status int
		text   string
	}{{200, "one"}, {429, ""}, {429, ""}} {
		got := call(t, c, s, "openai", "m", false)
		if got.status() != want.status {
			t.Fatalf("request %d: status %d, want %d", i+1, got.status(), want.status)
		}
	}
	clk.Advance(time.Second)
	got := call(t, c, s, "openai", "m", false)
	if got.status() != 200 || !bytes.Contains(got.body, []byte(`"two"`)) {
		t.Errorf("after the refill: status %d, body %s; want 200 with \"two\"", got.status(), got.body)
	}
}

// The tokens bucket refuses a request whose answer it cannot pay for, with
// OpenAI's type "tokens", even when requests are left.
func TestLimitTokens(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"openai", "anthropic"} {
		s, clk := limitedServer(t)
		s.Script("m", Answer("a b c d e")) // 10 + 5 = 15 tokens
		s.Limit("m", Limits{Requests: Bucket{Rate: 100, Burst: 100}, Tokens: Bucket{Rate: 10, Burst: 20}})
		c := newClient(t)
		if got := call(t, c, s, api, "m", false); got.status() != 200 {
			t.Fatalf("%s first: status %d, want 200", api, got.status())
		}
		got := call(t, c, s, api, "m", false)
		if got.status() != 429 {
			t.Fatalf("%s second: status %d, want 429", api, got.status())
		}
		// 5 left, 15 needed: 10 more at 10 a second.
		if ra := got.resp.Header.Get("Retry-After"); ra != "1" {
			t.Errorf("%s: Retry-After = %q, want \"1\"", api, ra)
		}
		body := decode(t, got.body)
		wantType := "tokens"
		typ := body.(map[string]any)["error"].(map[string]any)["type"]
		if api == "anthropic" {
			wantType = "rate_limit_error"
		}
		if typ != wantType {
			t.Errorf("%s: error type = %v, want %q", api, typ, wantType)
		}
		clk.Advance(time.Second)
		if got := call(t, c, s, api, "m", false); got.status() != 200 {
			t.Errorf("%s after the refill: status %d, want 200", api, got.status())
		}
		steps := []string{}
		for _, r := range s.Requests() {
			steps = append(steps, r.Step)
		}
		if diff := cmp.Diff([]string{"answer", "status 429 tokens", "answer"}, steps); diff != "" {
			t.Errorf("%s: steps (-want +got):\n%s", api, diff)
		}
	}
}

// Every response of a limited model carries the headers, a scripted error
// too; a step's own header wins over the server's; the zero Limits lifts
// the limits.
func TestLimitEveryResponse(t *testing.T) {
	t.Parallel()
	s, _ := limitedServer(t)
	s.Script("m", Status(503), Status(429).WithHeader("x-ratelimit-remaining-requests", "42"), Answer("x"))
	s.Limit("m", Limits{Requests: Bucket{Rate: 1, Burst: 10}})
	c := newClient(t)
	for _, want := range []struct {
		status    int
		remaining string
	}{{503, "9"}, {429, "42"}} {
		got := call(t, c, s, "openai", "m", false)
		if got.status() != want.status || got.resp.Header.Values("X-Ratelimit-Remaining-Requests")[0] != want.remaining || len(got.resp.Header.Values("X-Ratelimit-Remaining-Requests")) != 1 {
			t.Errorf("status %d, remaining %q; want %d, %q", got.status(), got.resp.Header.Values("X-Ratelimit-Remaining-Requests"), want.status, want.remaining)
		}
	}
	// A refusal is not the step: it sends the server's reading.
	s.Script("n", Answer("x").WithHeader("x-ratelimit-remaining-requests", "42"))
	s.Limit("n", Limits{Requests: Bucket{Rate: 1, Burst: 1}})
	for _, want := range []string{"42", "0"} {
		if got := call(t, c, s, "openai", "n", false).resp.Header.Values("X-Ratelimit-Remaining-Requests"); len(got) != 1 || got[0] != want {
			t.Errorf("remaining = %q, want %q", got, want)
		}
	}

	s.Limit("m", Limits{})
	got := call(t, c, s, "openai", "m", false)
	if h := limitHeaders("openai", got.resp.Header); got.status() != 200 || len(h) != 0 {
		t.Errorf("lifted: status %d, headers %v; want 200 and none", got.status(), h)
	}
}

// Limit refuses a bucket it cannot meter, with a panic that names it.
func TestLimitPanics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		l    Limits
	}{
		{"no_rate", Limits{Requests: Bucket{Burst: 1}}},
		{"no_burst", Limits{Requests: Bucket{Rate: 1}}},
		{"negative_rate", Limits{Tokens: Bucket{Rate: -1, Burst: 1}}},
		{"nan_rate", Limits{Tokens: Bucket{Rate: math.NaN(), Burst: 1}}},
		{"too_fast", Limits{Requests: Bucket{Rate: 2e9, Burst: 1}}},
		{"negative_burst", Limits{Requests: Bucket{Rate: 1, Burst: -1}}},
		{"century_to_fill", Limits{Tokens: Bucket{Rate: 1, Burst: 1 << 40}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("Limit(%+v) did not panic", tc.l)
				}
			}()
			s.Limit("m", tc.l)
		})
	}
}

// A burst of concurrent requests larger than the bucket: exactly Burst
// are let through, the rest refused, each response's remaining agrees
// with how many went before it, and the log holds every request.
func TestLimitConcurrentBurst(t *testing.T) {
	t.Parallel()
	const burst, calls = 5, 20
	s, _ := limitedServer(t) // the clock stands still: no refill
	s.Script("m", Answer("x"))
	s.Limit("m", Limits{Requests: Bucket{Rate: 1, Burst: burst}})
	c := newClient(t)
	var wg sync.WaitGroup
	statuses := make([]int, calls)
	remaining := make([]string, calls)
	for i := range calls {
		wg.Go(func() {
			got := call(t, c, s, "openai", "m", false)
			if got.err != nil {
				t.Errorf("call %d: %v", i, got.err)
				return
			}
			statuses[i], remaining[i] = got.status(), got.resp.Header.Get("X-Ratelimit-Remaining-Requests")
		})
	}
	wg.Wait()
	count := map[int]int{}
	seen := map[string]int{}
	for i := range calls {
		count[statuses[i]]++
		if statuses[i] == 200 {
			seen[remaining[i]]++
		} else if remaining[i] != "0" {
			t.Errorf("a refusal says %q remaining, want 0", remaining[i])
		}
	}
	if diff := cmp.Diff(map[int]int{200: burst, 429: calls - burst}, count); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"4": 1, "3": 1, "2": 1, "1": 1, "0": 1}, seen); diff != "" {
		t.Errorf("remaining of the answers (-want +got):\n%s", diff)
	}
	if n := len(s.Requests()); n != calls {
		t.Errorf("len(Requests()) = %d, want %d", n, calls)
	}
}
