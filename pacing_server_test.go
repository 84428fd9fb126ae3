package llmretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A burst of calls larger than the bucket, through a Breaker that paces
// by the headers a plain net/http Call reports, draws no 429: every call
// is answered, and every request the server logged was let through. The
// bucket holds 5 and refills 2 a second, so the 31 requests take some
// 13 s of real time; the test counts, and asserts no timing.
//
// One call goes first, alone: a Breaker does not pace before its first
// report, so a cold burst would meet the bucket unpaced.
func TestPacingAgainstTestServer(t *testing.T) {
	if testing.Short() {
		t.Skip("takes some 13 s of real time")
	}
	t.Parallel()
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("m", llmretrytest.Answer("x"))
	srv.Limit("m", llmretrytest.Limits{Requests: llmretrytest.Bucket{Rate: 2, Burst: 5}})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	call := func(ctx context.Context, _ string) (string, error) {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.OpenAIBaseURL()+"chat/completions", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		llmretry.ReportLimits(ctx, resp.Header)
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
		}
		return string(b), nil
	}
	c := &chain{Backends: []backend{{Model: "m", Call: call, Breaker: &llmretry.Breaker{}}}}
	if _, err := c.Do(t.Context(), "first"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	const burst = 30
	errs := make([]error, burst)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = c.Do(t.Context(), "burst") })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Errorf("Do() = %v, want every call answered", err)
	}
	log := srv.Requests()
	refused := 0
	for _, r := range log {
		if r.Step != "answer" {
			refused++
		}
	}
	if refused != 0 || len(log) != burst+1 {
		t.Errorf("server log: %d requests, %d not answered; want %d, 0", len(log), refused, burst+1)
	}
}
