package anthropicretry_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A chain that retries an overloaded model and then fails over to a
// smaller one, streaming its answer. The scripted server stands in for the
// API; a real client is anthropic.NewClient().
func Example() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("claude-opus-4-1", llmretrytest.Status(529)) // overloaded, for good
	srv.Script("claude-haiku-4-5", llmretrytest.Answer("Hello from Haiku."))
	client := anthropic.NewClient(option.WithBaseURL(srv.AnthropicBaseURL()), option.WithAPIKey("sk-ant-example"))
	build := func(prompt string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{MaxTokens: 1024, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}}
	}

	opus := anthropicretry.Messages(client, "claude-opus-4-1", build)
	opus.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}}
	haiku := anthropicretry.MessagesStream(client, "claude-haiku-4-5", build, func(_, delta string) { os.Stdout.WriteString(delta) })
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{opus, haiku}}
	answer, err := chain.Do(context.Background(), "Say hello.")

	fmt.Println()
	fmt.Println(answer.Model, answer.StopReason, err)
	for _, r := range srv.Requests() {
		fmt.Println(r.Model, r.N, r.Step)
	}
	// Output:
	// Hello from Haiku.
	// claude-haiku-4-5 end_turn <nil>
	// claude-opus-4-1 1 status 529
	// claude-opus-4-1 2 status 529
	// claude-haiku-4-5 1 answer
}

// With a nil emit, the stream is held until the answer is whole, so a
// stream cut halfway has reached no one and is simply sent again;
// StallTimeout still cuts a stream that goes quiet.
func ExampleMessagesStream_buffered() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("claude-haiku-4-5", llmretrytest.StreamDrop(2), llmretrytest.Answer("Hello, whole."))
	client := anthropic.NewClient(option.WithBaseURL(srv.AnthropicBaseURL()), option.WithAPIKey("sk-ant-example"))
	build := func(prompt string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{MaxTokens: 1024, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}}
	}

	haiku := anthropicretry.MessagesStream(client, "claude-haiku-4-5", build, nil)
	haiku.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}}
	haiku.StallTimeout = 30 * time.Second
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{haiku},
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			outcome := "ok"
			if a.Err != nil {
				outcome = a.Kind.String() + ", " + string(a.Next)
			}
			fmt.Printf("try %d: %s, delivered %v, %d tokens in, %d out\n",
				a.Try, outcome, a.Delivered, a.Usage.InputTokens, a.Usage.OutputTokens)
		},
	}
	answer, err := chain.Do(context.Background(), "Say hello.")
	fmt.Println(answer.Text, err)
	// Output:
	// try 1: transient, retry, delivered false, 10 tokens in, 1 out
	// try 2: ok, delivered false, 10 tokens in, 2 out
	// Hello, whole. <nil>
}
