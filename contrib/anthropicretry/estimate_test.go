package anthropicretry_test

import (
	"encoding/json"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
)

// The estimates below follow the rule the package doc gives: the text's
// UTF-8 bytes / 4, rounded up, plus 4 a message (the system prompt one
// of them); the output budget max_tokens.

// TestEstimate checks the estimate of known Messages requests, as both
// Messages and MessagesStream set it.
func TestEstimate(t *testing.T) {
	weather := anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
		Name:        "weather",
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}},
	}}
	toolJSON, err := json.Marshal([]anthropic.ToolUnionParam{weather})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		params anthropic.MessageNewParams
		want   llmretry.Usage
	}{
		{
			name: "system_and_user",
			params: anthropic.MessageNewParams{
				MaxTokens: 1024,
				System:    []anthropic.TextBlockParam{{Text: "You are terse."}},                                                         // 14 bytes
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What is the capital of France?"))}, // 30
			},
			want: llmretry.Usage{InputTokens: 11 + 2*4, OutputTokens: 1024}, // 44/4
		},
		{
			name: "bytes_not_characters",
			params: anthropic.MessageNewParams{
				MaxTokens: 10,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("日本語"))}, // 9 bytes
			},
			want: llmretry.Usage{InputTokens: 3 + 4, OutputTokens: 10},
		},
		{
			name: "tool_use_and_result",
			params: anthropic.MessageNewParams{
				MaxTokens: 100,
				Messages: []anthropic.MessageParam{
					anthropic.NewUserMessage(anthropic.NewTextBlock("weather?"), // 8 bytes
						anthropic.NewImageBlockBase64("image/png", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")), // not counted
					anthropic.NewAssistantMessage(
						anthropic.NewThinkingBlock("sig", "hmm"),                                  // 3
						anthropic.NewToolUseBlock("tu_1", map[string]any{"city": "Paris"}, "get"), // 3 + len(`{"city":"Paris"}`) 16
					),
					anthropic.NewUserMessage(anthropic.NewToolResultBlock("tu_1", "sunny", false)), // 5
				},
			},
			want: llmretry.Usage{InputTokens: 9 + 3*4, OutputTokens: 100}, // 35/4 rounded up
		},
		{
			name: "tools",
			params: anthropic.MessageNewParams{
				MaxTokens: 1,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
				Tools:     []anthropic.ToolUnionParam{weather},
			},
			want: llmretry.Usage{InputTokens: int64((2+len(toolJSON)+3)/4) + 4, OutputTokens: 1},
		},
	}
	client := anthropic.NewClient(option.WithAPIKey(fakeKey), option.WithBaseURL("http://127.0.0.1:1/"))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			build := func(string) anthropic.MessageNewParams { return tc.params }
			for _, b := range []llmretry.Backend[string, llmretry.Completion]{
				anthropicretry.Messages(client, "claude-sonnet-4-5", build),
				anthropicretry.MessagesStream(client, "claude-sonnet-4-5", build, nil),
			} {
				if b.Estimate == nil {
					t.Fatalf("backend (Stream %v): Estimate is nil, want set", b.Stream)
				}
				if diff := cmp.Diff(tc.want, b.Estimate("q")); diff != "" {
					t.Errorf("backend (Stream %v): Estimate() (-want +got):\n%s", b.Stream, diff)
				}
			}
		})
	}
}
