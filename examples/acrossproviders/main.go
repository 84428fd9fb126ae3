// Command acrossproviders runs one chain across two providers: OpenAI
// first, Anthropic when OpenAI gives up. Both adapters answer with an
// llmretry.Completion, so the caller does not care which one did. Two
// scripted servers (llmretrytest) stand in for the APIs; against the real
// ones, build the clients with openai.NewClient() and
// anthropic.NewClient().
//
// It lives in a module of its own because it is the one place that
// imports both SDKs: each adapter's module requires only its own.
package main

import (
	"context"
	"fmt"
	"os"
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

func main() {
	openaiAPI, anthropicAPI := llmretrytest.NewServer(), llmretrytest.NewServer()
	defer openaiAPI.Close()
	defer anthropicAPI.Close()
	openaiAPI.Script("gpt-4o", llmretrytest.Status(503)) // down, for good
	anthropicAPI.Script("claude-sonnet-4-5", llmretrytest.Answer("Rayleigh scattering."))

	chain := newChain(
		openai.NewClient(option.WithBaseURL(openaiAPI.OpenAIBaseURL()), option.WithAPIKey("sk-example")),
		anthropic.NewClient(aoption.WithBaseURL(anthropicAPI.AnthropicBaseURL()), aoption.WithAPIKey("sk-ant-example")),
	)
	chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) { fmt.Println(a) }
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(answer.Model+":", answer.Text)
}

// newChain builds the chain: gpt-4o, retried once after a short wait, then
// claude-sonnet-4-5.
func newChain(oai openai.Client, ant anthropic.Client) *llmretry.Chain[string, llmretry.Completion] {
	gpt := openairetry.Chat(oai, "gpt-4o", func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	})
	gpt.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}} // seconds in production
	claude := anthropicretry.Messages(ant, "claude-sonnet-4-5", func(q string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{MaxTokens: 1024, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(q))}}
	})
	return &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{gpt, claude}}
}
