// Command pool shows one model served from three deployments as one
// backend of a llmretry.Chain, and prints where each request went and
// why.
//
// The deployments are scripted providers (llmretrytest servers on
// 127.0.0.1): two API keys of the same tier, each behind a rate limit of
// two requests (then one every ten seconds), and a pay-as-you-go
// deployment of a higher tier, without a limit, to spill over to. Every
// answer carries the provider's rate-limit headers; the Call hands them
// to the deployment's Breaker (llmretry.ReportLimits), and the pool sends
// each request to the deployment with the most headroom left. Once
// neither key has any, the requests go to pay-as-you-go instead of
// drawing a 429.
//
//	go run ./examples/pool
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

const (
	model     = "gpt-4o"
	maxTokens = 256
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pool:", err)
		os.Exit(1)
	}
}

// run sends six requests through the pool, one after another, and writes
// where each went to w. It returns an error only when a request failed.
func run(w io.Writer) error {
	keyA, keyB, paygo := llmretrytest.NewServer(), llmretrytest.NewServer(), llmretrytest.NewServer()
	defer keyA.Close()
	defer keyB.Close()
	defer paygo.Close()
	for _, srv := range []*llmretrytest.Server{keyA, keyB, paygo} {
		srv.Script(model, llmretrytest.Answer("Retries need jitter so that clients do not retry in step."))
	}
	limit := llmretrytest.Limits{Requests: llmretrytest.Bucket{Rate: 0.1, Burst: 2}}
	keyA.Limit(model, limit)
	keyB.Limit(model, limit)

	// A deployment is a Backend of its own, as an adapter builds it, with
	// a Breaker of its own: its health and its headroom. Tier 1 takes
	// only what tier 0 cannot.
	deployment := func(name string, srv *llmretrytest.Server, tier int) llmretry.Deployment[string, string] {
		return llmretry.Deployment[string, string]{Name: name, Tier: tier, Backend: llmretry.Backend[string, string]{
			Model:   model,
			Call:    chat(srv.OpenAIBaseURL() + "chat/completions"),
			Breaker: &llmretry.Breaker{},
			// What a request will use, charged against the provider's
			// token limits until its answer says: its prompt, about four
			// characters a token, and its completion budget.
			Estimate: func(prompt string) llmretry.Usage {
				return llmretry.Usage{InputTokens: int64(len(prompt)/4 + 1), OutputTokens: maxTokens}
			},
		}}
	}
	request := 0
	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{{
			Model: model,
			Pool: []llmretry.Deployment[string, string]{
				deployment("key-a", keyA, 0),
				deployment("key-b", keyB, 0),
				deployment("paygo", paygo, 1),
			},
		}},
		// Every attempt's record names its deployment and why the pool
		// chose it.
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			outcome := "answered"
			if a.Err != nil {
				outcome = a.Kind.String()
			}
			fmt.Fprintf(w, "%-8d %-11s %-10s %s\n", request, a.Deployment, a.Chosen, outcome)
		},
	}

	fmt.Fprintln(w, "key-a and key-b (tier 0): 2 requests, then 1 every 10 s each; paygo (tier 1): no limit")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-8s %-11s %-10s %s\n", "request", "deployment", "why", "outcome")
	for request = 1; request <= 6; request++ {
		if _, err := chain.Do(context.Background(), "In one sentence: why do retries need jitter?"); err != nil {
			return fmt.Errorf("request %d: %w", request, err)
		}
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "why: order = alike, the first in the pool's order; headroom = the most left by its")
	fmt.Fprintln(w, "provider's last report; tier = the only one of the first tier that could take it;")
	fmt.Fprintln(w, "spill = no deployment of the first tier could take it now")
	fmt.Fprintln(w)
	for _, d := range []struct {
		name string
		srv  *llmretrytest.Server
	}{{"key-a", keyA}, {"key-b", keyB}, {"paygo", paygo}} {
		var steps []string
		for _, r := range d.srv.Requests() {
			steps = append(steps, r.Step)
		}
		fmt.Fprintf(w, "%s got %d requests: %s\n", d.name, len(steps), strings.Join(steps, ", "))
	}
	return nil
}

// chat is a deployment's Call: an OpenAI chat completion posted to url.
// Every response's rate-limit headers go to the deployment's Breaker,
// the 429s' included; a status of 400 or more is a StatusFailure.
func chat(url string) func(context.Context, string) (string, error) {
	return func(ctx context.Context, prompt string) (string, error) {
		body, err := json.Marshal(map[string]any{
			"model":      model,
			"max_tokens": maxTokens,
			"messages":   []map[string]string{{"role": "user", "content": prompt}},
		})
		if err != nil {
			return "", err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		llmretry.ReportLimits(ctx, resp.Header)
		if resp.StatusCode >= 400 {
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
		}
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) == 0 {
			return "", llmretry.ParseFailure("", fmt.Errorf("no answer in the response: %v", err))
		}
		llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: out.Usage.PromptTokens, OutputTokens: out.Usage.CompletionTokens})
		return out.Choices[0].Message.Content, nil
	}
}
