package llmretrytest_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/llmretry/llmretry/llmretrytest"
)

// A model behind a bucket of two requests that refills one every ten
// seconds: the third request at once is refused, and every response says
// how much is left.
func ExampleServer_Limit() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("gpt-4o", llmretrytest.Answer("Paris."))
	srv.Limit("gpt-4o", llmretrytest.Limits{Requests: llmretrytest.Bucket{Rate: 0.1, Burst: 2}})

	for range 3 {
		resp, err := http.Post(srv.OpenAIBaseURL()+"chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"Capital of France?"}]}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "remaining", resp.Header.Get("x-ratelimit-remaining-requests"), "of", resp.Header.Get("x-ratelimit-limit-requests"))
	}
	for _, r := range srv.Requests() {
		fmt.Println(r.N, r.Step)
	}
	// Output:
	// 200 remaining 1 of 2
	// 200 remaining 0 of 2
	// 429 remaining 0 of 2
	// 1 answer
	// 2 answer
	// 3 status 429 requests
}
