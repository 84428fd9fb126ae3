package openairetry_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
)

// The estimates below follow the rule the package doc gives: the text's
// UTF-8 bytes / 4, rounded up, plus 4 a message; the output budget as
// the request states it, or 0.

// offline is a client for tests that send nothing.
var offline = openai.NewClient(option.WithAPIKey(testKey), option.WithBaseURL("http://127.0.0.1:1/"))

// weatherTool is a tool definition; its JSON counts as input.
var weatherTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name:        "weather",
	Description: openai.String("The weather in a city."),
	Parameters:  shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
})

// TestChatEstimate checks the estimate of known Chat Completions
// requests, as both Chat and ChatStream set it.
func TestChatEstimate(t *testing.T) {
	toolJSON, err := json.Marshal([]openai.ChatCompletionToolUnionParam{weatherTool})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		params openai.ChatCompletionNewParams
		want   llmretry.Usage
	}{
		{
			name: "system_and_user",
			params: openai.ChatCompletionNewParams{
				Messages: []openai.ChatCompletionMessageParamUnion{
					openai.SystemMessage("You are terse."),               // 14 bytes
					openai.UserMessage("What is the capital of France?"), // 30
				},
				MaxCompletionTokens: openai.Int(100),
			},
			want: llmretry.Usage{InputTokens: 11 + 2*4, OutputTokens: 100}, // 44/4
		},
		{
			name: "max_tokens_times_n",
			params: openai.ChatCompletionNewParams{
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("abcde")},
				MaxTokens: openai.Int(50),
				N:         openai.Int(3),
			},
			want: llmretry.Usage{InputTokens: 2 + 4, OutputTokens: 150}, // 5/4 rounded up
		},
		{
			name: "max_completion_tokens_over_max_tokens",
			params: openai.ChatCompletionNewParams{
				Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("abcd")},
				MaxTokens:           openai.Int(50),
				MaxCompletionTokens: openai.Int(70),
			},
			want: llmretry.Usage{InputTokens: 1 + 4, OutputTokens: 70},
		},
		{
			name:   "no_budget",
			params: openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}},
			want:   llmretry.Usage{InputTokens: 1 + 4}, // the model's default budget is not known
		},
		{
			name:   "bytes_not_characters",
			params: openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("日本語")}}, // 9 bytes
			want:   llmretry.Usage{InputTokens: 3 + 4},
		},
		{
			name: "parts_and_tool_calls",
			params: openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{
				openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
					openai.TextContentPart("12345678"), // 8 bytes
					openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: "data:image/png;base64,AAAAAAAAAAAAAAAA"}), // not counted
				}),
				{OfAssistant: &openai.ChatCompletionAssistantMessageParam{ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{ID: "call_1", Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
						Name: "get", Arguments: `{"a":1}`, // 3 + 7
					}},
				}}}},
				openai.ToolMessage("sunny", "call_1"), // 5
			}},
			want: llmretry.Usage{InputTokens: 6 + 3*4}, // 23/4 rounded up
		},
		{
			name: "tools",
			params: openai.ChatCompletionNewParams{
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
				Tools:    []openai.ChatCompletionToolUnionParam{weatherTool},
			},
			want: llmretry.Usage{InputTokens: int64((2+len(toolJSON)+3)/4) + 4},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			build := func(string) openai.ChatCompletionNewParams { return tc.params }
			for _, b := range []llmretry.Backend[string, llmretry.Completion]{
				openairetry.Chat(offline, "gpt-4o", build),
				openairetry.ChatStream(offline, "gpt-4o", build, nil),
			} {
				if b.Estimate == nil {
					t.Fatalf("%s backend: Estimate is nil, want set", stream1(b))
				}
				if diff := cmp.Diff(tc.want, b.Estimate("q")); diff != "" {
					t.Errorf("%s backend: Estimate() (-want +got):\n%s", stream1(b), diff)
				}
			}
		})
	}
}

// TestResponsesEstimate checks the estimate of known Responses API
// requests, as both Responses and ResponsesStream set it.
func TestResponsesEstimate(t *testing.T) {
	tests := []struct {
		name   string
		params responses.ResponseNewParams
		want   llmretry.Usage
	}{
		{
			name: "instructions_and_string",
			params: responses.ResponseNewParams{
				Instructions:    openai.String("Be brief."),                                                             // 9 bytes
				Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Why is the sky blue?")}, // 20
				MaxOutputTokens: openai.Int(200),
			},
			want: llmretry.Usage{InputTokens: 8 + 2*4, OutputTokens: 200}, // 29/4 rounded up
		},
		{
			name: "items",
			params: responses.ResponseNewParams{Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
				responses.ResponseInputItemParamOfMessage("hello", responses.EasyInputMessageRoleUser),                                                    // 5 bytes
				responses.ResponseInputItemParamOfFunctionCall("{}", "call_1", "f"),                                                                       // 2 + 1
				responses.ResponseInputItemParamOfFunctionCallOutput("42"),                                                                                // 2
				{OfReasoning: &responses.ResponseReasoningItemParam{ID: "rs_1", Summary: []responses.ResponseReasoningItemSummaryParam{{Text: "think"}}}}, // 5
			}}},
			want: llmretry.Usage{InputTokens: 4 + 4*4}, // 15/4 rounded up; no budget: 0
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			build := func(string) responses.ResponseNewParams { return tc.params }
			for _, b := range []llmretry.Backend[string, llmretry.Completion]{
				openairetry.Responses(offline, "gpt-4o", build),
				openairetry.ResponsesStream(offline, "gpt-4o", build, nil),
			} {
				if b.Estimate == nil {
					t.Fatalf("%s backend: Estimate is nil, want set", stream1(b))
				}
				if diff := cmp.Diff(tc.want, b.Estimate("q")); diff != "" {
					t.Errorf("%s backend: Estimate() (-want +got):\n%s", stream1(b), diff)
				}
			}
		})
	}
}

// stream1 names a backend's mode in a message.
func stream1(b llmretry.Backend[string, llmretry.Completion]) string {
	if b.Stream {
		return "streaming"
	}
	return "plain"
}
