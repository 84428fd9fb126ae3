package llmretry_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// parseLimits reads the headers llmretrytest's buckets send, as each
// provider documents them, into what the bucket holds, and never puts the
// next admission before the bucket really admits it. The bucket refills
// one request every 10 s, slow enough that no refill happens while the
// test runs, however slow the machine: every number below is exact.
func TestParseLimitsOfTestServer(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Second
	for _, api := range []string{"openai", "anthropic"} {
		t.Run(api, func(t *testing.T) {
			t.Parallel()
			srv := llmretrytest.NewServer()
			defer srv.Close()
			srv.Script("m", llmretrytest.Answer("x")) // costs 10 + 1 tokens
			srv.Limit("m", llmretrytest.Limits{
				Requests: llmretrytest.Bucket{Rate: 0.1, Burst: 3},
				Tokens:   llmretrytest.Bucket{Rate: 0.1, Burst: 1000},
			})
			url, body := srv.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
			if api == "anthropic" {
				url, body = srv.URL+"/v1/messages", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
			}
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}

			wants := []struct {
				status           int
				requests, tokens int64 // remaining
			}{{200, 2, 989}, {200, 1, 978}, {200, 0, 967}, {429, 0, 967}}
			var reports []llmretry.Limits
			for i, want := range wants {
				sent := time.Now()
				resp, err := c.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatalf("request %d: %v", i+1, err)
				}
				read := time.Now()
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				r, ok := llmretry.ParseLimits(resp.Header, sent, read)
				if resp.StatusCode != want.status || !ok {
					t.Fatalf("request %d: status %d, parseLimits ok %v; want %d, true", i+1, resp.StatusCode, ok, want.status)
				}
				if r.RequestsLimit != 3 || r.RequestsRemaining != want.requests || r.TokensLimit != 1000 || r.TokensRemaining != want.tokens {
					t.Errorf("request %d: requests %d of %d, tokens %d of %d; want %d of 3, %d of 1000",
						i+1, r.RequestsRemaining, r.RequestsLimit, r.TokensRemaining, r.TokensLimit, want.requests, want.tokens)
				}
				// Neither the server nor the parser rounds a reading up
				// by more than this.
				slack := time.Millisecond
				if api == "anthropic" {
					slack = time.Second
				}
				if late := read.Add(interval + slack); r.RequestsNext.After(late) {
					t.Errorf("request %d: requests.next = read+%v, want at most read+%v", i+1, r.RequestsNext.Sub(read), interval+slack)
				}
				reports = append(reports, r)
			}
			// The bucket was full at the first request, so the first
			// request it took is back one interval after the server
			// admitted it, and not before: no reading may say earlier.
			first := srv.Requests()[0].Time
			for i, r := range reports {
				if back := first.Add(interval); r.RequestsNext.Before(back) {
					t.Errorf("request %d: requests.next = %v before the bucket's next request at %v (early by %v)", i+1, r.RequestsNext, back, back.Sub(r.RequestsNext))
				}
			}
			if got := reports[3].RetryAt; got.IsZero() {
				t.Errorf("429: retryAt is zero; want the Retry-After it sent")
			}
		})
	}
}
