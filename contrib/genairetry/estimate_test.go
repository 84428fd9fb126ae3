package genairetry_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genai"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
)

// The estimates below follow the rule the package doc gives: the text's
// UTF-8 bytes / 4, rounded up, plus 4 a content (the system instruction
// one of them); the output budget maxOutputTokens times candidateCount,
// or 0.

// TestEstimate checks the estimate of known requests, as both
// GenerateContent and GenerateContentStream set it.
func TestEstimate(t *testing.T) {
	tools := []*genai.Tool{{FunctionDeclarations: []*genai.FunctionDeclaration{{Name: "weather", Description: "The weather in a city."}}}}
	toolJSON, err := json.Marshal(tools)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		contents []*genai.Content
		config   *genai.GenerateContentConfig
		want     llmretry.Usage
	}{
		{
			name:     "system_and_user",
			contents: genai.Text("What is the capital of France?"), // 30 bytes
			config: &genai.GenerateContentConfig{
				SystemInstruction: genai.NewContentFromText("You are terse.", genai.RoleUser), // 14
				MaxOutputTokens:   1024,
			},
			want: llmretry.Usage{InputTokens: 11 + 2*4, OutputTokens: 1024}, // 44/4
		},
		{
			name:     "candidates",
			contents: genai.Text("abcde"),
			config:   &genai.GenerateContentConfig{MaxOutputTokens: 50, CandidateCount: 3},
			want:     llmretry.Usage{InputTokens: 2 + 4, OutputTokens: 150}, // 5/4 rounded up
		},
		{
			name:     "no_config",
			contents: genai.Text("日本語"),                  // 9 bytes
			want:     llmretry.Usage{InputTokens: 3 + 4}, // no budget: the model's default is not known
		},
		{
			name: "function_call_and_response",
			contents: []*genai.Content{
				{Role: genai.RoleUser, Parts: []*genai.Part{
					genai.NewPartFromText("weather?"),                                    // 8 bytes
					genai.NewPartFromBytes([]byte("not counted, an image"), "image/png"), // not counted
				}},
				{Role: genai.RoleModel, Parts: []*genai.Part{genai.NewPartFromFunctionCall("get", map[string]any{"city": "Paris"})}},      // 3 + 16
				{Role: genai.RoleUser, Parts: []*genai.Part{genai.NewPartFromFunctionResponse("get", map[string]any{"output": "sunny"})}}, // 3 + 18
			},
			config: &genai.GenerateContentConfig{MaxOutputTokens: 100},
			want:   llmretry.Usage{InputTokens: 12 + 3*4, OutputTokens: 100}, // 48/4
		},
		{
			name:     "tools",
			contents: genai.Text("hi"),
			config:   &genai.GenerateContentConfig{Tools: tools},
			want:     llmretry.Usage{InputTokens: int64((2+len(toolJSON)+3)/4) + 4},
		},
	}
	client := clientAt(t, "http://127.0.0.1:1/", nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			build := func(string) ([]*genai.Content, *genai.GenerateContentConfig) { return tc.contents, tc.config }
			for _, b := range []llmretry.Backend[string, llmretry.Completion]{
				genairetry.GenerateContent(client, "gemini-2.5-flash", build),
				genairetry.GenerateContentStream(client, "gemini-2.5-flash", build, nil),
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
