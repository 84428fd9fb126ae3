package llmretrytest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmretry/llmretry/llmretrytest"
)

// A gigabyte answer, made as it is sent: a client that bounds its read
// takes a megabyte and lets go, and the server stops sending.
func ExampleHugeBody() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("m", llmretrytest.HugeBody(1<<30))

	resp, err := http.Post(srv.OpenAIBaseURL()+"chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("announced more than 1 GiB:", resp.ContentLength > 1<<30)
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	fmt.Println(len(b), err)
	// Output:
	// announced more than 1 GiB: true
	// 1048576 <nil>
}

// A host that takes the connection and never answers: only the client's
// own deadline ends the request.
func ExampleBlackhole() {
	hole := llmretrytest.NewBlackhole()
	defer hole.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hole.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output: true
}
