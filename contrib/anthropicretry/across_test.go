package anthropicretry_test

import (
	"context"
	"fmt"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// One chain across both providers: Anthropic first, OpenAI when Anthropic
// gives up. Both answer a Completion, so the caller does not care which
// did. Two scripted servers stand in for the APIs; against the real ones,
// build the clients with anthropic.NewClient() and openai.NewClient().
func Example_acrossProviders() {
	anthropicAPI, openaiAPI := llmretrytest.NewServer(), llmretrytest.NewServer()
	defer anthropicAPI.Close()
	defer openaiAPI.Close()
	anthropicAPI.Script("claude-sonnet-4-5", llmretrytest.Status(529)) // overloaded, for good
	openaiAPI.Script("gpt-4o", llmretrytest.Answer("Rayleigh scattering."))
	ant := anthropic.NewClient(option.WithBaseURL(anthropicAPI.AnthropicBaseURL()), option.WithAPIKey("sk-ant-example"))
	oai := openai.NewClient(ooption.WithBaseURL(openaiAPI.OpenAIBaseURL()), ooption.WithAPIKey("sk-example"))

	claude := anthropicretry.Messages(ant, "claude-sonnet-4-5", func(q string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{MaxTokens: 1024, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(q))}}
	})
	claude.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}} // seconds in production
	gpt := openairetry.Chat(oai, "gpt-4o", func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	})
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{claude, gpt}}
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")

	fmt.Println(answer.Model+":", answer.Text, err)
	fmt.Println("requests to Anthropic:", len(anthropicAPI.Requests()), "to OpenAI:", len(openaiAPI.Requests()))
	// Output:
	// gpt-4o: Rayleigh scattering. <nil>
	// requests to Anthropic: 2 to OpenAI: 1
}
