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

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
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
