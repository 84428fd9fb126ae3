package genairetry_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
	"github.com/llmretry/llmretry/llmretrytest"
	"google.golang.org/genai"
)

// A chain that waits out Gemini's rate limit as its RetryInfo asks, and
// fails over from a model whose daily quota is spent without retrying it.
// The scripted server stands in for the API; a real client is built the
// same way without the BaseURL.
func Example() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("gemini-2.5-pro", llmretrytest.InsufficientQuota()) // the day's quota is spent
	srv.Script("gemini-2.5-flash", llmretrytest.RetryDelay(20*time.Millisecond), llmretrytest.Answer("Hello from Flash."))
	client, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey:      "example-key",
		Backend:     genai.BackendGeminiAPI,
		HTTPOptions: genai.HTTPOptions{BaseURL: srv.GeminiBaseURL()},
		HTTPClient:  &http.Client{Transport: genairetry.Transport(nil)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	build := func(prompt string) ([]*genai.Content, *genai.GenerateContentConfig) {
		return genai.Text(prompt), nil
	}

	pro := genairetry.GenerateContent(client, "gemini-2.5-pro", build)
	pro.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}}
	flash := genairetry.GenerateContentStream(client, "gemini-2.5-flash", build, nil)
	flash.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}}
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{pro, flash},
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			if a.Err != nil {
				fmt.Println(a.Model, a.Kind, a.Next, "retry-after", a.RetryAfter)
			}
		},
	}
	answer, err := chain.Do(context.Background(), "Say hello.")

	fmt.Println(answer.Model+":", answer.Text, answer.StopReason, err)
	for _, r := range srv.Requests() {
		fmt.Println(r.Model, r.N, r.Step)
	}
	// Output:
	// gemini-2.5-pro rejected fail_over retry-after 0s
	// gemini-2.5-flash transient retry retry-after 20ms
	// gemini-2.5-flash: Hello from Flash. STOP <nil>
	// gemini-2.5-pro 1 status 429 insufficient_quota
	// gemini-2.5-flash 1 status 429 retry_delay
	// gemini-2.5-flash 2 answer
}
