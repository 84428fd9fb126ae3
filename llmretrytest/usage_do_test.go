package llmretrytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A chain's error JSON totals what the provider reported: the usage of
// every response that told one (a parse failure, a truncation) and, as
// unknown, the requests that got no status and no usage (a body cut
// before its usage block, a stall), each as the server's log has it.
func TestErrorUsageMatchesServer(t *testing.T) {
	t.Parallel()
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("a",
		llmretrytest.Status(503),
		llmretrytest.StreamDrop(2), // a JSON body cut halfway, before its usage
		llmretrytest.Answer(""),    // no text: a parse failure, billed
		llmretrytest.StallHeaders(),
	)
	srv.Script("b", llmretrytest.Answer("  "), llmretrytest.Truncated("The answer is"))
	retry := llmretry.Policy{Waits: []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}}
	chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
		{Model: "a", Call: billedChat(srv.OpenAIBaseURL(), "a"), Retry: retry, Timeout: 300 * time.Millisecond},
		{Model: "b", Call: billedChat(srv.OpenAIBaseURL(), "b"), Retry: retry},
	}}
	_, err := chain.Do(t.Context(), "What is the capital of France?")
	var truncated *llmretry.Truncated
	if !errors.As(err, &truncated) {
		t.Fatalf("Do() = %v, want a *Truncated", err)
	}
	b, jerr := json.Marshal(err)
	if jerr != nil {
		t.Fatalf("json.Marshal(err): %v", jerr)
	}
	var got struct {
		Usage        *llmretry.Usage    `json:"usage"`
		UsageUnknown int                `json:"usage_unknown"`
		Attempts     []llmretry.Attempt `json:"attempts"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("decoding the error's JSON: %v\n%s", err, b)
	}

	var want struct {
		usage    llmretry.Usage
		unknown  int
		attempts []*llmretry.Usage
	}
	for _, r := range srv.Requests() {
		var u *llmretry.Usage
		switch {
		case r.Usage != nil:
			// llmretrytest.Usage has llmretry.Usage's fields, so it converts.
			c := llmretry.Usage(*r.Usage)
			u = &c
			want.usage = want.usage.Add(c)
		case !strings.HasPrefix(r.Step, "status "):
			want.unknown++
		}
		want.attempts = append(want.attempts, u)
	}
	if want.unknown != 2 || len(want.attempts) != 6 {
		t.Fatalf("server log has %d requests, %d of unknown cost; want 6 and 2, as scripted", len(want.attempts), want.unknown)
	}
	if diff := cmp.Diff(&want.usage, got.Usage); diff != "" {
		t.Errorf("error JSON's usage against the server's log (-log +error):\n%s", diff)
	}
	if got.UsageUnknown != want.unknown {
		t.Errorf("error JSON's usage_unknown = %d, want %d", got.UsageUnknown, want.unknown)
	}
	var attempts []*llmretry.Usage
	for _, a := range got.Attempts {
		attempts = append(attempts, a.Usage)
	}
	if diff := cmp.Diff(want.attempts, attempts); diff != "" {
		t.Errorf("error JSON's attempts' usage against the server's log (-log +error):\n%s", diff)
	}
}

// billedChat is a backend call like chat's that reads the answer's usage
// and its finish_reason, as an adapter does: an answer reports its usage,
// and a truncation or an answer with no text carries it in its Failure.
func billedChat(baseURL, model string) func(ctx context.Context, prompt string) (string, error) {
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
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			_, _ = io.Copy(io.Discard, resp.Body)
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(resp.Status))
		}
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return "", err // a cut body: transient, and nothing was told of its cost
		}
		var usage *llmretry.Usage
		if out.Usage != nil {
			usage = &llmretry.Usage{InputTokens: out.Usage.PromptTokens, OutputTokens: out.Usage.CompletionTokens}
		}
		if len(out.Choices) == 0 {
			return "", &llmretry.Failure{Kind: llmretry.KindParse, Err: errors.New("no choices"), Usage: usage}
		}
		text := out.Choices[0].Message.Content
		var f *llmretry.Failure
		switch {
		case out.Choices[0].FinishReason == "length":
			f = llmretry.Truncation(text)
		case strings.TrimSpace(text) == "":
			f = llmretry.ParseFailure(text, errors.New("no text"))
		default:
			if usage != nil {
				llmretry.ReportUsage(ctx, *usage)
			}
			return text, nil
		}
		f.Usage = usage
		return "", f
	}
}
