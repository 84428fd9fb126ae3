package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"

	"github.com/llmretry/llmretry"
)

// answer is an HTTP handler in front of a chain, as the README shows it:
// the chain's error becomes the status and Retry-After that HTTPStatus
// gives, with no mapping of its own.
func answer(chain *llmretry.Chain[string, string]) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		text, err := chain.Do(r.Context(), r.FormValue("q"))
		if err != nil {
			status, after := llmretry.HTTPStatus(err)
			if after > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(after.Seconds()))))
			}
			// err.Error() is for your logs: the client gets the status.
			http.Error(w, http.StatusText(status), status)
			return
		}
		fmt.Fprintln(w, text)
	}
}

// A handler answers for the chain's outcome: 503 with the providers'
// Retry-After while both are overloaded, the provider's own 400 for a
// request every backend rejected, 502 for a truncated answer.
func ExampleHTTPStatus() {
	fail := func(f *llmretry.Failure) func(context.Context, string) (string, error) {
		return func(context.Context, string) (string, error) { return "", f }
	}
	overloaded := llmretry.StatusFailure(http.StatusServiceUnavailable, http.Header{"Retry-After": {"30"}}, errors.New("overloaded"))
	tooLong := llmretry.StatusFailure(http.StatusBadRequest, nil, errors.New("prompt is too long"))
	for _, f := range []*llmretry.Failure{overloaded, tooLong, llmretry.Truncation("The answer is")} {
		chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
			{Model: "gpt-4o", Call: fail(f)},
			{Model: "claude-sonnet-4-5", Call: fail(f)},
		}}
		w := httptest.NewRecorder()
		answer(chain)(w, httptest.NewRequest(http.MethodGet, "/answer?q=hello", nil))
		fmt.Printf("%d Retry-After %q\n", w.Code, w.Header().Get("Retry-After"))
	}
	// Output:
	// 503 Retry-After "30"
	// 400 Retry-After ""
	// 502 Retry-After ""
}
