package llmretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmretry/llmretry"
)

// statusSecret is planted in the request URL that the backend's error
// names, as net/http names it; nothing the chain prints may carry it.
const statusSecret = "sk-proj-Fuzz0Secret1Planted2InTheURL3"

// FuzzStatusFailure follows an HTTP error response of any status and any
// header values (several per key, as proxies send them) from
// StatusFailure through a Chain, in virtual time: the record keeps the
// Failure's Kind, status and hint; the chain retries after the longer of
// its wait and the hint, ends the backend's retries on a hint past
// MaxWait, fails over at once on a Kind it does not retry; and no record,
// error text or JSON carries the key planted in the URL.
func FuzzStatusFailure(f *testing.F) {
	f.Add(429, "", "1e18", "", "", "rate limited")
	f.Add(503, "", "-1", "5", "", "busy")
	f.Add(429, "NaN", "NaN", "", "", "")
	f.Add(503, "", "Thu, 01 Jan 1970 00:00:00 GMT", "", "", "")
	f.Add(503, "", "Fri, 31 Dec 9999 23:59:59 GMT", "", "", "")
	f.Add(529, "250", "", "", "true", `{"type":"error","error":{"type":"overloaded_error"}}`)
	f.Add(500, "", "300", "301", "false", "internal")
	f.Add(429, "300001", "", "", "", "just past the default MaxWait")
	f.Add(400, "", "7", "", "TRUE", "context_length_exceeded")
	f.Add(200, "", "", "", "", "ok?")
	f.Add(-1, "", "\u00a012", "", "ｔｒｕｅ", "\xff\xfe")
	f.Fuzz(func(t *testing.T, code int, ms, ra, ra2, should, body string) {
		h := http.Header{}
		add := func(key, v string) {
			if v != "" {
				h.Add(key, v)
			}
		}
		add("Retry-After-Ms", ms)
		add("Retry-After", ra)
		add("Retry-After", ra2) // a second value: Header.Get reads the first
		add("X-Should-Retry", should)
		cause := errors.New(`Post "https://user:` + statusSecret + `@api.example/v1/chat?api_key=` + statusSecret + `": ` + body)

		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			var fl *llmretry.Failure
			calls := 0
			const wait = 2 * time.Second
			c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
				Model: "m",
				Call: func(ctx context.Context, req string) (string, error) {
					calls++
					if calls == 1 {
						fl = llmretry.StatusFailure(code, h, cause)
						return "", fl
					}
					return "answer", nil
				},
				Retry: llmretry.Policy{Waits: []time.Duration{wait}},
			}}}
			var seen []llmretry.Attempt
			c.OnAttempt = func(_ context.Context, a llmretry.Attempt) { seen = append(seen, a) }
			resp, err := c.Do(context.Background(), "q")

			first := seen[0]
			if first.Kind != fl.Kind || first.Status != code || first.RetryAfter != fl.RetryAfter {
				t.Fatalf("record of %d %q = kind %v, status %d, retry_after %v; want the Failure's %v, %d, %v",
					code, h, first.Kind, first.Status, first.RetryAfter, fl.Kind, code, fl.RetryAfter)
			}
			if fl.RetryAfter < 0 {
				t.Fatalf("StatusFailure(%d, %q).RetryAfter = %v, want never negative", code, h, fl.RetryAfter)
			}
			retried := fl.Kind == llmretry.KindTransient || fl.Kind == llmretry.KindTimeout || fl.Kind == llmretry.KindParse
			switch {
			case retried && fl.RetryAfter > llmretry.DefaultMaxWait:
				if first.Next != llmretry.NextStop || first.Why != llmretry.WhyMaxWait || err == nil {
					t.Fatalf("hint %v past MaxWait: record says %v/%v, Do err %v; want stop/max_wait and an error", fl.RetryAfter, first.Next, first.Why, err)
				}
			case retried:
				in := max(wait, fl.RetryAfter)
				if first.Next != llmretry.NextRetry || first.RetryIn != in {
					t.Fatalf("hint %v: record says %v in %v, want retry in %v", fl.RetryAfter, first.Next, first.RetryIn, in)
				}
				if resp != "answer" || err != nil || time.Since(start) != in {
					t.Fatalf("Do() = %q, %v after %v; want the answer after %v", resp, err, time.Since(start), in)
				}
			default:
				if first.Next != llmretry.NextStop || first.Why != llmretry.WhyNotRetryable || err == nil {
					t.Fatalf("kind %v: record says %v/%v, Do err %v; want stop/not_retryable and an error", fl.Kind, first.Next, first.Why, err)
				}
				if got, want := llmretry.RetryItem(err), fl.Kind != llmretry.KindRejected; got != want {
					t.Fatalf("RetryItem after one %v attempt = %v, want %v", fl.Kind, got, want)
				}
			}

			var printed []string
			for _, a := range seen {
				data, jerr := json.Marshal(a)
				if jerr != nil {
					t.Fatalf("json.Marshal(record) = %v", jerr)
				}
				printed = append(printed, a.String(), string(data))
			}
			if err != nil {
				data, jerr := json.Marshal(err)
				if jerr != nil {
					t.Fatalf("json.Marshal(error) = %v", jerr)
				}
				printed = append(printed, err.Error(), string(data))
			}
			printed = append(printed, fl.Error())
			for _, p := range printed {
				if strings.Contains(p, statusSecret) {
					t.Fatalf("the planted key survives in %q", p)
				}
			}
		})
	})
}
