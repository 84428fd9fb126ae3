package openairetry_test

import (
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// Every backend passes the scripted provider's conformance suite.
func TestConformance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		make llmretrytest.MakeBackend
	}{
		{"chat", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.Chat(newClient(srv), model, build)
		}},
		{"chat_stream", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.ChatStream(newClient(srv), model, build, nil)
		}},
		{"responses", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.Responses(newClient(srv), model, buildResponses)
		}},
		{"responses_stream", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.ResponsesStream(newClient(srv), model, buildResponses, nil)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			llmretrytest.TestBackend(t, tc.make)
		})
	}
}
