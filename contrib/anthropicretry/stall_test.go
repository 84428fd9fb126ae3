package anthropicretry_test

import (
	"testing"
	"time"

	"github.com/llmretry/llmretry/llmretrytest"
)

// stall is the StallTimeout of these tests: long enough that a loaded
// machine running -race still delivers a chunk within it, short enough for
// a quick suite.
const stall = 500 * time.Millisecond

func TestStallTimeout(t *testing.T) {
	t.Parallel()
	slow := llmretrytest.Answer("one two three four five six seven eight nine ten").Every(stall / 5)
	tests := []struct {
		name      string
		mode      mode
		step      llmretrytest.Step
		want      []string // the records' kinds
		delivered bool     // the first record's Delivered
		raw       string   // the first record's RawText, "" for none
	}{
		// Nothing arrives: the attempt is ended and tried again.
		{"json_no_headers", jsonMode, llmretrytest.StallHeaders(), []string{"claude-a timeout", "claude-a ok"}, false, ""},
		{"stream_before_text", streamMode, llmretrytest.StreamStall(0), []string{"claude-a timeout", "claude-a ok"}, false, ""},
		// The caller holds two chunks: the stall ends the chain.
		{"stream_after_text", streamMode, llmretrytest.StreamStall(2), []string{"claude-a timeout"}, true, "chunk1 chunk2 "},
		// Held chunks have reached no one: the stall is tried again.
		{"buffered_after_text", bufferedMode, llmretrytest.StreamStall(2), []string{"claude-a timeout", "claude-a ok"}, false, "chunk1 chunk2 "},
		// Text keeps coming for longer than StallTimeout, but never stops
		// for that long: no stall, whether it is delivered or held.
		{"stream_slow_but_steady", streamMode, slow, []string{"claude-a ok"}, true, ""},
		{"buffered_slow_but_steady", bufferedMode, slow, []string{"claude-a ok"}, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", tc.step, llmretrytest.Answer("ok"))
			b := tc.mode.backend(newClient(srv), "claude-a", tiny, nil)
			b.StallTimeout = stall
			_, records, err := run(t.Context(), b)
			checkKinds(t, records, tc.want...)
			first := records[0]
			if first.Delivered != tc.delivered {
				t.Errorf("first record's Delivered = %v, want %v", first.Delivered, tc.delivered)
			}
			if first.Err != nil {
				if first.Elapsed < stall || first.Elapsed > stall+5*time.Second {
					t.Errorf("stalled attempt took %v, want about %v", first.Elapsed, stall)
				}
				if got := first.RawText; (got == nil) != (tc.raw == "") || got != nil && *got != tc.raw {
					t.Errorf("RawText = %v, want %q", got, tc.raw)
				}
			}
			matchLog(t, records, err, srv)
		})
	}
}
