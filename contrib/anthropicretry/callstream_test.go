package anthropicretry_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A call that streams to a consumer of its own (Chain.Stream) gets each
// piece of text as it arrives from a streaming backend built without an
// emit, and a plain backend's answer whole; a stream cut before any text
// is sent again, one cut after text ends the call with what the
// consumer got.
func TestCallStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		steps  []llmretrytest.Step
		want   []string // the stream's chunks
		failed bool     // the last pair is an error
		plain  []string // the chunks of a plain backend
	}{
		{"answer", []llmretrytest.Step{llmretrytest.Answer("The sky is blue.")}, []string{"The ", "sky ", "is ", "blue."}, false, []string{"The sky is blue."}},
		{"cut_before_text", []llmretrytest.Step{llmretrytest.StreamDrop(0), llmretrytest.Answer("Hi there.")}, []string{"Hi ", "there."}, false, []string{"Hi there."}},
		{"cut_after_text", []llmretrytest.Step{llmretrytest.StreamDrop(2), llmretrytest.Answer("Hi there.")}, []string{"chunk1 ", "chunk2 "}, true, []string{"Hi there."}},
	}
	for _, tc := range tests {
		for _, m := range []mode{jsonMode, bufferedMode} {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("claude-a", tc.steps...)
				b := m.backend(newClient(srv), "claude-a", tiny, nil)
				chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{b}}
				var (
					got  []string
					errs []error
				)
				for chunk, err := range chain.Stream(t.Context(), "Say hello.") {
					if err != nil {
						errs = append(errs, err)
						continue
					}
					got = append(got, chunk.Text)
				}
				want, failed := tc.want, tc.failed
				if !m.stream {
					want, failed = tc.plain, false
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("chunks (-want +got):\n%s", diff)
				}
				if (len(errs) == 1) != failed || len(errs) > 1 {
					t.Errorf("errors = %v, want failed %v", errs, failed)
				}
			})
		}
	}
}
