package openairetry_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
)

// A server that takes the prefix continues the answer; one that is
// replayed answers from the start, and the caller gets what follows its
// own text once. A replayed answer that begins otherwise is not
// delivered, and the answer starts again.
func TestPrefixIgnored(t *testing.T) {
	t.Parallel()
	world := chunk(`{"content":" world"}`, "")
	other := chunk(`{"content":"Howdy"}`, "")
	tests := []struct {
		name    string
		style   openairetry.PrefixStyle
		second  string // the body of the request that continues
		want    string // what the call's stream assembles
		records int
	}{
		{"continued", openairetry.PrefixFlag, chatRole + world + chatFinish + chatDone, "Hello world", 2},
		{"replayed", openairetry.Replay, chatRole + chatHello + world + chatFinish + chatDone, "Hello world", 2},
		// A replay that answers differently fails, and is not tried again:
		// the answer starts again.
		{"replay_diverged", openairetry.Replay, chatRole + other + world + chatFinish + chatDone, "Howdy world", 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			client, _ := rawServer(t, chatRole+chatHello+cutOff, tc.second)
			b := openairetry.WithPrefix(openairetry.ChatStream(client, "gpt-a", build, nil), tc.style)
			b.Retry = waits(3)
			var records []llmretry.Attempt
			chain := &llmretry.Chain[string, llmretry.Completion]{
				Backends: []llmretry.Backend[string, llmretry.Completion]{b}, Continue: true, Restart: true,
			}
			chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) { records = append(records, a) }
			var got strings.Builder
			for c, err := range chain.Stream(t.Context(), "hi") {
				if err != nil {
					t.Fatalf("Stream yielded %v, want the answer", err)
				}
				if c.Restart {
					got.Reset()
				}
				got.WriteString(c.Text)
			}
			if got.String() != tc.want || len(records) != tc.records {
				t.Errorf("the stream assembled %q in %d attempts, want %q in %d", got.String(), len(records), tc.want, tc.records)
			}
			if tc.name == "replay_diverged" && len(records) > 1 && !errors.Is(records[1].Err, llmretry.ErrCannotContinue) {
				t.Errorf("record %v: want the divergence to wrap llmretry.ErrCannotContinue", records[1])
			}
		})
	}
}
