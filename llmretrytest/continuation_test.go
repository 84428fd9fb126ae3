package llmretrytest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The steps that break an answer partway are named in the log, and
// refuse what they cannot break.
func TestBreakingSteps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		step Step
		want string
	}{
		{Answer("a b c").DropAfter(2), "answer drop after 2"},
		{Truncated("a b c").StallAfter(0), "truncated stall after 0"},
		{Refuse("a b").GarbleAfter(1), "refused garble after 1"},
		{Answer("a b c").FailAfter(3, "overloaded_error"), "answer error overloaded_error after 3"},
	}
	for _, tc := range tests {
		if got := tc.step.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
	for name, f := range map[string]func(){
		"negative":  func() { Answer("a").DropAfter(-1) },
		"no_text":   func() { Status(503).StallAfter(1) },
		"tool_call": func() { ToolCall("f", "{}").GarbleAfter(1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic, want one", name)
				}
			}()
			f()
		}()
	}
}

// texts is the text of a stream's events, as each API carries it.
func texts(t *testing.T, api string, body []byte) string {
	t.Helper()
	var b strings.Builder
	for _, e := range parseSSE(t, body) {
		m, _ := e.Data.(map[string]any)
		switch api {
		case "anthropic":
			if d, ok := m["delta"].(map[string]any); ok && m["type"] == "content_block_delta" {
				b.WriteString(d["text"].(string))
			}
		case "openai":
			if cs, ok := m["choices"].([]any); ok && len(cs) > 0 {
				if c, ok := cs[0].(map[string]any)["delta"].(map[string]any)["content"].(string); ok {
					b.WriteString(c)
				}
			}
		case "openai-responses":
			if m["type"] == "response.output_text.delta" {
				b.WriteString(m["delta"].(string))
			}
		}
	}
	return b.String()
}

// A request that gives the model text to go on from plays the rest of
// the scripted answer, and the log says what it continued: an Anthropic
// prefill, a Chat Completions prefix. A prefill that ends with white
// space is refused as Anthropic refuses it; text the answer does not
// begin with is a 400.
func TestContinuation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, api, body string
		status          int    // the response's
		text            string // the stream's text
		step            string // the log's
		continues       string // the log's
	}{
		{
			"anthropic_prefill", "anthropic",
			`{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"The sky"}]}]}`,
			200, " is blue.", "answer", "The sky",
		},
		{
			"anthropic_trailing_space", "anthropic",
			`{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The sky "}]}`,
			400, "", "status 400", "",
		},
		{
			"openai_prefix", "openai",
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The sky ","prefix":true}]}`,
			200, "is blue.", "answer", "The sky ",
		},
		{
			"openai_continue_final_message", "openai",
			`{"model":"m","stream":true,"continue_final_message":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The sky "}]}`,
			200, "is blue.", "answer", "The sky ",
		},
		{
			// An assistant message without a flag is history, not a
			// prefix.
			"openai_history", "openai",
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The sky "}]}`,
			200, "The sky is blue.", "answer", "",
		},
		{
			"not_the_answer", "openai",
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The sea ","prefix":true}]}`,
			400, "", "status 400", "The sea ",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", Answer("The sky is blue."))
			got := send(t.Context(), newClient(t), s, paths[tc.api], tc.body)
			if got.err != nil || got.resp.StatusCode != tc.status {
				t.Fatalf("status %v, %v; want %d", got.resp, got.err, tc.status)
			}
			if tc.status == 200 {
				if text := texts(t, tc.api, got.body); text != tc.text {
					t.Errorf("stream's text = %q, want %q", text, tc.text)
				}
			}
			log := s.Requests()
			if len(log) != 1 || log[0].Step != tc.step || log[0].Continues != tc.continues {
				t.Errorf("log = %+v, want one request of step %q continuing %q", log, tc.step, tc.continues)
			}
		})
	}
}

// A Responses stream asked for in the background is kept: a GET resumes
// it after a sequence number with the rest of its text, playing the
// model's next step, and is logged as a request that continues what was
// sent up to there. An id the server does not keep is a 404.
func TestBackgroundResume(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("The sky is blue.").DropAfter(2), Answer("The sky is blue.").DropAfter(1), Answer("unused"))
	c := newClient(t)
	body := `{"model":"m","stream":true,"background":true,"input":"hi"}`
	first := send(t.Context(), c, s, "/v1/responses", body)
	if text := texts(t, "openai-responses", first.body); first.resp == nil || text != "The sky " {
		t.Fatalf("first stream's text = %q (%v), want the two chunks before the drop", text, first.err)
	}
	get := func(path string) result {
		resp, err := c.Get(s.URL + path)
		if err != nil {
			return result{err: err}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return result{resp: resp, body: b, err: err}
	}
	// After sequence number 2, the second chunk's: one more chunk, and
	// the drop the next step says.
	second := get("/v1/responses/resp_m_1?stream=true&starting_after=2")
	if text := texts(t, "openai-responses", second.body); second.resp == nil || text != "is " {
		t.Errorf("resumed stream's text = %q (%v), want the next chunk", text, second.err)
	}
	third := get("/v1/responses/resp_m_1?stream=true&starting_after=3")
	events := parseSSE(t, third.body)
	if text := texts(t, "openai-responses", third.body); text != "blue." || len(events) == 0 {
		t.Fatalf("second resumption's text = %q, want the last chunk", text)
	}
	last, _ := events[len(events)-1].Data.(map[string]any)
	resp, _ := last["response"].(map[string]any)
	if last["type"] != "response.completed" || resp["id"] != "resp_m_1" || last["sequence_number"] != json.Number("5") && last["sequence_number"] != 5.0 {
		t.Errorf("last event = %v, want response.completed of resp_m_1, sequence number 5", last)
	}
	if got := get("/v1/responses/resp_nope?stream=true"); got.resp == nil || got.resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET of an unknown id = %v, want 404", got.resp)
	}
	var steps, continues []string
	for _, r := range s.Requests() {
		steps = append(steps, r.Step)
		continues = append(continues, r.Continues)
	}
	wantSteps := []string{"answer drop after 2", "answer drop after 1", "answer", "status 404"}
	wantContinues := []string{"", "The sky ", "The sky is ", ""}
	if strings.Join(steps, "|") != strings.Join(wantSteps, "|") || strings.Join(continues, "|") != strings.Join(wantContinues, "|") {
		t.Errorf("log steps %q continuing %q, want %q continuing %q", steps, continues, wantSteps, wantContinues)
	}
}
