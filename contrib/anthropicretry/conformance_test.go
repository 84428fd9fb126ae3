package anthropicretry_test

import (
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// Both backends pass the scripted provider's conformance suite.
func TestConformance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		make llmretrytest.MakeBackend
	}{
		{"messages", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return anthropicretry.Messages(newClient(srv), model, build)
		}},
		{"messages_stream", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return anthropicretry.MessagesStream(newClient(srv), model, build, nil)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			llmretrytest.TestBackend(t, tc.make)
		})
	}
}
