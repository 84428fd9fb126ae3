package genairetry_test

import (
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// Both backends pass the scripted provider's conformance suite, with a
// client built as the docs say, on the package's Transport.
func TestConformance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		make func(t *testing.T) llmretrytest.MakeBackend
	}{
		{"generate_content", func(t *testing.T) llmretrytest.MakeBackend {
			return func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
				return genairetry.GenerateContent(newClient(t, srv), model, build)
			}
		}},
		{"generate_content_stream", func(t *testing.T) llmretrytest.MakeBackend {
			return func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
				return genairetry.GenerateContentStream(newClient(t, srv), model, build, nil)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			llmretrytest.TestBackend(t, tc.make(t))
		})
	}
}
