package llmretrytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A scripted provider behind a chain: the primary model answers 503 and
// then 429, so the chain retries it once and fails over to the second
// model, which answers. The server's log shows what the provider saw.
func Example() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("gpt-4o",
		llmretrytest.Status(503),
		llmretrytest.Status(429).WithHeader("retry-after-ms", "10"),
	)
	srv.Script("gpt-4o-mini", llmretrytest.Answer("Paris is the capital of France."))

	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{
			{Model: "gpt-4o", Call: chat(srv.OpenAIBaseURL(), "gpt-4o"), Retry: llmretry.Policy{Waits: []time.Duration{time.Millisecond}}},
			{Model: "gpt-4o-mini", Call: chat(srv.OpenAIBaseURL(), "gpt-4o-mini")},
		},
		OnAttempt: func(ctx context.Context, a llmretry.Attempt) { fmt.Println(a) },
	}
	answer, err := chain.Do(context.Background(), "What is the capital of France?")
	fmt.Println(answer, err)

	for _, r := range srv.Requests() {
		fmt.Println(r.API, r.Model, r.N, r.Step)
	}
	// Output:
	// [backend 0 gpt-4o try 1] http 503: The server is overloaded or not ready yet. (retrying in 1ms)
	// [backend 0 gpt-4o try 2] http 429: Rate limit reached for requests. (failing over: waits_used)
	// [backend 1 gpt-4o-mini try 1] ok
	// Paris is the capital of France. <nil>
	// openai gpt-4o 1 status 503
	// openai gpt-4o 2 status 429
	// openai gpt-4o-mini 1 answer
}

// chat returns a backend call that asks model for a chat completion with
// plain net/http, as a program without an SDK would.
func chat(baseURL, model string) func(ctx context.Context, prompt string) (string, error) {
	return func(ctx context.Context, prompt string) (string, error) {
		body, err := json.Marshal(map[string]any{
			"model":    model,
			"messages": []map[string]string{{"role": "user", "content": prompt}},
		})
		if err != nil {
			return "", err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"chat/completions", bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err // llmretry.Classify knows refused and dropped connections
		}
		defer resp.Body.Close()

		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		decodeErr := json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode >= 400 {
			// StatusFailure reads retry-after and x-should-retry from the
			// headers and classifies the status.
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(out.Error.Message))
		}
		if decodeErr != nil || len(out.Choices) == 0 {
			return "", llmretry.ParseFailure("", fmt.Errorf("no answer in the response: %v", decodeErr))
		}
		return out.Choices[0].Message.Content, nil
	}
}
