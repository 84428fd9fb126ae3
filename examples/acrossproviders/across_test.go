package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/genai"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A chain from OpenAI to Anthropic fails over across providers, with one
// request per attempt and the records matching each server's log: OpenAI's
// quota refusal is not retried, Anthropic's 529 is, and its stream answers.
func TestChainAcrossProviders(t *testing.T) {
	openaiAPI, anthropicAPI := llmretrytest.NewServer(), llmretrytest.NewServer()
	defer openaiAPI.Close()
	defer anthropicAPI.Close()
	openaiAPI.Script("gpt-4o", llmretrytest.InsufficientQuota())
	anthropicAPI.Script("claude-sonnet-4-5", llmretrytest.Status(529), llmretrytest.Answer("across"))
	// Default SDK retries left on: the adapters turn them off per request.
	oai := openai.NewClient(option.WithBaseURL(openaiAPI.OpenAIBaseURL()), option.WithAPIKey("sk-test"))
	ant := anthropic.NewClient(aoption.WithBaseURL(anthropicAPI.AnthropicBaseURL()), aoption.WithAPIKey("sk-ant-test"))

	gpt := openairetry.Chat(oai, "gpt-4o", func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	})
	gpt.Retry = llmretry.Policy{Waits: []time.Duration{time.Millisecond}}
	claude := anthropicretry.MessagesStream(ant, "claude-sonnet-4-5", func(q string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{MaxTokens: 64, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(q))}}
	}, nil)
	claude.Retry = llmretry.Policy{Waits: []time.Duration{time.Millisecond}}
	var seen []llmretry.Attempt
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends:  []llmretry.Backend[string, llmretry.Completion]{gpt, claude},
		OnAttempt: func(_ context.Context, a llmretry.Attempt) { seen = append(seen, a) },
	}

	answer, err := chain.Do(context.Background(), "hi")
	if err != nil || answer.Text != "across" || answer.Model != "claude-sonnet-4-5" {
		t.Fatalf("Do() = %q from %q, %v, want %q from claude-sonnet-4-5, nil", answer.Text, answer.Model, err, "across")
	}
	if _, ok := answer.Raw.(*anthropic.Message); !ok {
		t.Errorf("answer.Raw = %T, want *anthropic.Message", answer.Raw)
	}
	type rec struct {
		model, kind, next string
		status            int
	}
	var got []rec
	for _, a := range seen {
		got = append(got, rec{a.Model, a.Kind.String(), string(a.Next), a.Status})
	}
	want := []rec{
		{"gpt-4o", "rejected", "fail_over", 429},
		{"claude-sonnet-4-5", "transient", "retry", 529},
		{"claude-sonnet-4-5", "unknown", "", 0}, // the answer
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records = %v, want %v", got, want)
	}
	if n, m := len(openaiAPI.Requests()), len(anthropicAPI.Requests()); n != 1 || m != 2 {
		t.Errorf("requests to OpenAI, Anthropic = %d, %d, want 1, 2 (one per attempt)", n, m)
	}
	var f *llmretry.Failure
	if !errors.As(seen[0].Err, &f) || f.Kind != llmretry.KindRejected {
		t.Errorf("OpenAI's quota refusal = %v, want a rejected *llmretry.Failure", seen[0].Err)
	}
}

// A chain from OpenAI to Anthropic to Gemini: OpenAI's spent quota fails
// over at once, Anthropic's 529s use up its retries, and Gemini's 429 is
// waited out for as long as its RetryInfo says before its buffered stream
// answers. One request per attempt on each of the three.
func TestChainAcrossThreeProviders(t *testing.T) {
	openaiAPI, anthropicAPI, geminiAPI := llmretrytest.NewServer(), llmretrytest.NewServer(), llmretrytest.NewServer()
	defer openaiAPI.Close()
	defer anthropicAPI.Close()
	defer geminiAPI.Close()
	openaiAPI.Script("gpt-4o", llmretrytest.InsufficientQuota())
	anthropicAPI.Script("claude-sonnet-4-5", llmretrytest.Status(529))
	geminiAPI.Script("gemini-2.5-flash", llmretrytest.RetryDelay(50*time.Millisecond), llmretrytest.Answer("across three"))
	oai := openai.NewClient(option.WithBaseURL(openaiAPI.OpenAIBaseURL()), option.WithAPIKey("sk-test"))
	ant := anthropic.NewClient(aoption.WithBaseURL(anthropicAPI.AnthropicBaseURL()), aoption.WithAPIKey("sk-ant-test"))
	gem, err := geminiClient(t.Context(), geminiAPI.GeminiBaseURL())
	if err != nil {
		t.Fatal(err)
	}
	chain := newChain(oai, ant, gem)
	gemini := genairetry.GenerateContentStream(gem, "gemini-2.5-flash", func(q string) ([]*genai.Content, *genai.GenerateContentConfig) {
		return genai.Text(q), nil
	}, nil)
	gemini.Retry = llmretry.Policy{Waits: []time.Duration{time.Millisecond}}
	chain.Backends[2] = gemini
	var seen []llmretry.Attempt
	chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) { seen = append(seen, a) }

	answer, err := chain.Do(t.Context(), "hi")
	if err != nil || answer.Text != "across three" || answer.Model != "gemini-2.5-flash" {
		t.Fatalf("Do() = %q from %q, %v, want %q from gemini-2.5-flash, nil", answer.Text, answer.Model, err, "across three")
	}
	if _, ok := answer.Raw.(*genai.GenerateContentResponse); !ok {
		t.Errorf("answer.Raw = %T, want *genai.GenerateContentResponse", answer.Raw)
	}
	type rec struct {
		model, kind, next string
		status            int
		retryAfter        time.Duration
	}
	var got []rec
	for _, a := range seen {
		got = append(got, rec{a.Model, a.Kind.String(), string(a.Next), a.Status, a.RetryAfter})
	}
	want := []rec{
		{"gpt-4o", "rejected", "fail_over", 429, 0},
		{"claude-sonnet-4-5", "transient", "retry", 529, 0},
		{"claude-sonnet-4-5", "transient", "fail_over", 529, 0},
		{"gemini-2.5-flash", "transient", "retry", 429, 50 * time.Millisecond},
		{"gemini-2.5-flash", "unknown", "", 0, 0}, // the answer
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records = %v, want %v", got, want)
	}
	if n, m, g := len(openaiAPI.Requests()), len(anthropicAPI.Requests()), len(geminiAPI.Requests()); n != 1 || m != 2 || g != 2 {
		t.Errorf("requests to OpenAI, Anthropic, Gemini = %d, %d, %d, want 1, 2, 2 (one per attempt)", n, m, g)
	}
	if log := geminiAPI.Requests(); len(log) == 2 && log[1].Time.Sub(log[0].Time) < 50*time.Millisecond {
		t.Errorf("Gemini retried %v after its 429, want >= the 50ms its RetryInfo asked", log[1].Time.Sub(log[0].Time))
	}
}
