package llmretrytest

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The log's Usage is what the response told the client: a whole answer's
// usage, or a stream's last usage event before it broke off; nil when the
// client was told none.
func TestUsageLogged(t *testing.T) {
	t.Parallel()
	u := func(out int64) *Usage { return &Usage{InputTokens: 10, OutputTokens: out} }
	tests := []struct {
		name string
		step Step
		// want by API and stream: openai, openai stream, anthropic,
		// anthropic stream
		want [4]*Usage
	}{
		{"answer", Answer("one two three"), [4]*Usage{u(3), u(3), u(3), u(3)}},
		{"truncated", Truncated("one two"), [4]*Usage{u(2), u(2), u(2), u(2)}},
		{"refused", Refuse("no"), [4]*Usage{u(1), u(1), u(1), u(1)}},
		{"empty", Answer(""), [4]*Usage{u(0), u(0), u(0), u(0)}},
		// A JSON body is whole; a stream that never finishes told only
		// Anthropic's message_start.
		{"unfinished", StreamUnfinished(2), [4]*Usage{u(2), nil, u(2), u(1)}},
		// The JSON body is cut before its usage block; Anthropic's stream
		// had sent message_start.
		{"drop", StreamDrop(2), [4]*Usage{nil, nil, nil, u(1)}},
		{"error_in_stream", StreamError("overloaded_error"), [4]*Usage{nil, nil, nil, u(1)}},
		{"status", Status(503), [4]*Usage{}},
		{"malformed", Malformed(), [4]*Usage{}},
		{"hangup", Hangup(), [4]*Usage{}},
		{"huge_body", HugeBody(10), [4]*Usage{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			c := newClient(t)
			var got [4]*Usage
			for i, api := range []string{"openai", "anthropic"} {
				for j, stream := range []bool{false, true} {
					call(t, c, s, api, "m", stream)
					log := s.Requests()
					got[2*i+j] = log[len(log)-1].Usage
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("logged Usage of openai, openai stream, anthropic, anthropic stream (-want +got):\n%s", diff)
			}
		})
	}
}

// An OpenAI stream reports usage only when asked with
// stream_options.include_usage, so without it the log has none.
func TestUsageOpenAIStreamNotAsked(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("one two"))
	body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "m")
	if r := send(t.Context(), newClient(t), s, paths["openai"], body); r.err != nil {
		t.Fatalf("send: %v", r.err)
	}
	if got := s.Requests()[0].Usage; got != nil {
		t.Errorf("logged Usage = %+v, want nil", *got)
	}
}

// Requests copies each Usage: changing one changes no log.
func TestUsageIsACopy(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("hi"))
	call(t, newClient(t), s, "anthropic", "m", false)
	s.Requests()[0].Usage.OutputTokens = 99
	if got := s.Requests()[0].Usage; got == nil || got.OutputTokens != 1 {
		t.Errorf("Requests()[0].Usage = %+v after changing a copy, want 1 output token", got)
	}
}
