package llmretry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmretry/llmretry"
)

// streamAnswer is an HTTP handler that streams the chain's answer to its
// client as server-sent events, as the README shows it: the call streams
// to this request's response, and the backends need no writer of their
// own.
func streamAnswer(chain *llmretry.Chain[string, llmretry.Completion]) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		flush := http.NewResponseController(w).Flush
		for chunk, err := range chain.Stream(r.Context(), r.FormValue("q")) {
			if err != nil {
				// The status line went with the first chunk: the
				// error is an event.
				status, _ := llmretry.HTTPStatus(err)
				fmt.Fprintf(w, "event: error\ndata: %d\n\n", status)
				return
			}
			if chunk.Restart {
				// The chain starts the answer again (Chain.Restart):
				// the client discards what it has.
				fmt.Fprint(w, "event: restart\ndata: {}\n\n")
				continue
			}
			text, _ := json.Marshal(chunk.Text)
			fmt.Fprintf(w, "data: %s\n\n", text)
			flush()
		}
		fmt.Fprint(w, "event: done\ndata: {}\n\n")
	}
}

// Each request streams to its own client: the backend hands its text to
// llmretry.Emit, and the call's stream takes it from there. A stream that
// fails before any text is sent again, unseen.
func ExampleChain_Stream() {
	words := func(ctx context.Context, q string) (llmretry.Completion, error) {
		answer := "You asked: " + q
		for _, w := range strings.SplitAfter(answer, " ") {
			llmretry.Emit(ctx, w)
		}
		return llmretry.Completion{Text: answer}, nil
	}
	first := true
	cut := func(ctx context.Context, q string) (llmretry.Completion, error) {
		if first {
			first = false
			return llmretry.Completion{}, llmretry.StatusFailure(http.StatusBadGateway, nil, nil)
		}
		return words(ctx, q)
	}
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{
		{Model: "gpt-4o", Call: cut, Retry: llmretry.Policy{Waits: []time.Duration{0}}},
	}}
	w := httptest.NewRecorder()
	streamAnswer(chain)(w, httptest.NewRequest(http.MethodGet, "/stream?q=why", nil))
	fmt.Print(w.Body.String())
	// Output:
	// data: "You "
	//
	// data: "asked: "
	//
	// data: "why"
	//
	// event: done
	// data: {}
}
