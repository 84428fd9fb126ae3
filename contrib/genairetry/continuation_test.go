package genairetry_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// The SDK continues an answer on its own when a response carries a
// continuation token and no finish reason, by sending the request again.
// The Backends turn that off, so an attempt stays one request and the
// unfinished answer is the chain's to retry. The scripted server sends no
// tokens, so this one is raw.
func TestNoAutomaticContinuation(t *testing.T) {
	t.Parallel()
	const body = `{"candidates":[{"content":{"parts":[{"text":"Part one"}],"role":"model"},"continuationToken":"dG9rZW4=","index":0}],` +
		`"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2,"totalTokenCount":12}}`
	const finished = `{"candidates":[{"content":{"parts":[{"text":" and two."}],"role":"model"},"finishReason":"STOP","index":0}]}`
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			var requests atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				reply := body
				if in, _ := io.ReadAll(r.Body); strings.Contains(string(in), "dG9rZW4=") {
					// A continuation would be answered: the SDK would
					// turn two requests into one answer.
					reply = finished
				}
				if strings.Contains(r.URL.Path, ":streamGenerateContent") {
					w.Header().Set("Content-Type", "text/event-stream")
					w.Write([]byte("data: " + reply + "\n\n"))
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(reply))
			}))
			defer srv.Close()
			b := m.backend(clientAt(t, srv.URL+"/", nil), "gemini-a", tiny, nil)
			_, records, err := run(t.Context(), b)
			if err == nil {
				t.Fatal("Do() = nil error, want the unfinished answers")
			}
			if got, want := requests.Load(), int64(len(records)); got != want {
				t.Errorf("server got %d requests for %d attempts, want one each", got, want)
			}
			want := []string{"gemini-a transient", "gemini-a transient", "gemini-a transient"}
			if m.emit {
				want = want[:1] // the caller holds "Part one": nothing is resent
			}
			checkKinds(t, records, want...)
		})
	}
}
