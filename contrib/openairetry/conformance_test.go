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
		// The backends that continue an answer, and so run the suite's
		// continuation checks too.
		{"chat_stream_prefix", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.WithPrefix(openairetry.ChatStream(newClient(srv), model, build, nil), openairetry.PrefixFlag)
		}},
		{"chat_stream_continue_final_message", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.WithPrefix(openairetry.ChatStream(newClient(srv), model, build, nil), openairetry.ContinueFinalMessage)
		}},
		{"chat_stream_replay", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.WithPrefix(openairetry.ChatStream(newClient(srv), model, build, nil), openairetry.Replay)
		}},
		{"chat_prefix", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.WithPrefix(openairetry.Chat(newClient(srv), model, build), openairetry.PrefixFlag)
		}},
		{"responses_stream_background", func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return openairetry.WithBackground(openairetry.ResponsesStream(newClient(srv), model, buildResponses, nil))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			llmretrytest.TestBackend(t, tc.make)
		})
	}
}
