package llmretry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/llmretry/llmretry"
)

// Planted secrets: each is caught by a different redaction rule, and all
// share "PLANTED" so that none can slip through unnoticed.
const (
	plantedKey      = "sk-test-PLANTEDKEY0123456789abcdef" // a ?key= query value, and a provider-key shape
	plantedBearer   = "PLANTEDBEARER0123456789abcdef"      // after "Bearer "
	plantedPassword = "PLANTEDPASSWORD0123"                // URL userinfo
	planted         = "PLANTED"
)

// callURL is the backend's URL, with the key in the query as Gemini's
// REST API takes it.
func callURL(base string) string {
	return base + "/v1beta/models/gemini:generateContent?alt=sse&key=" + plantedKey
}

// httpCall posts to u with the key as a Bearer token too, and turns an
// error response into a StatusFailure whose text echoes the request, as
// SDK errors do.
func httpCall(u string) func(context.Context, string) (string, error) {
	return func(ctx context.Context, _ string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader("{}"))
		if err != nil {
			return "", err
		}
		req.Header.Set("Authorization", "Bearer "+plantedBearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			withUser := strings.Replace(u, "http://", "http://user:"+plantedPassword+"@", 1)
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header,
				fmt.Errorf("POST %s: %s", withUser, bytes.TrimSpace(body)))
		}
		return string(body), nil
	}
}

// Secrets in URLs, headers and keys never reach anything we render, on
// every failure path; the attempts' errors stay the originals.
func TestNoSecretsInAnyRendering(t *testing.T) {
	// Reading the body first lets the server notice the client hang up.
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hung.Close()
	defer close(release) // before Close, which waits for the handlers
	// A 503 whose body echoes the credentials it was sent, as some proxies do.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "upstream rejected %s with Authorization: %s", r.URL.RequestURI(), r.Header.Get("Authorization"))
	}))
	defer echo.Close()

	// A port nothing listens on: the connection is refused. Taken after
	// the servers start, so that neither of them can be given it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()

	// guard bounds the refused calls, should something else take the port.
	const guard = 10 * time.Second
	innerChain := &chain{Backends: []backend{
		{Model: "inner-refused", Call: httpCall(callURL(refused)), Timeout: guard},
		{Model: "inner-5xx", Call: httpCall(callURL(echo.URL))},
	}}
	tests := []struct {
		name     string
		backends []backend
		ctx      func() context.Context
	}{
		{name: "refused", backends: []backend{{Model: "gemini", Call: httpCall(callURL(refused)), Timeout: guard}}},
		{name: "timeout", backends: []backend{{Model: "gemini", Call: httpCall(callURL(hung.URL)), Timeout: 20 * ms}}},
		{name: "status_5xx", backends: []backend{{Model: "gemini", Call: httpCall(callURL(echo.URL))}}},
		{name: "nested", backends: []backend{{Model: "outer", Call: innerChain.Do}, {Model: "gemini", Call: httpCall(callURL(echo.URL))}}},
		{
			name:     "cancelled",
			backends: []backend{{Model: "gemini", Call: httpCall(callURL(echo.URL))}},
			ctx: func() context.Context {
				ctx, cancel := context.WithCancelCause(context.Background())
				cancel(fmt.Errorf("GET %s: client went away (Bearer %s)", callURL(refused), plantedBearer))
				return ctx
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			var seen []llmretry.Attempt
			c := &chain{Backends: tc.backends, OnAttempt: func(_ context.Context, a llmretry.Attempt) { seen = append(seen, a) }}

			_, err := c.Do(ctx, "hi")
			if err == nil {
				t.Fatal("Do() = nil error, want one")
			}
			// The secret must be there to be redacted: the originals keep it.
			if !strings.Contains(rawText(err), planted) {
				t.Fatalf("no planted secret in the original errors of %v: the test plants nothing", err)
			}
			check := func(what, s string) {
				t.Helper()
				if strings.Contains(s, planted) {
					t.Errorf("%s leaks a planted secret:\n%s", what, s)
				}
			}
			check("Error()", err.Error())
			check("json.Marshal(err)", mustJSON(t, err))
			check("slog JSON of the error", slogJSON(err))
			attempts := append(allAttempts(err), seen...)
			check("json.Marshal(attempts)", mustJSON(t, attempts))
			for i, a := range attempts {
				check(fmt.Sprintf("attempt %d String()", i), a.String())
				check(fmt.Sprintf("attempt %d json.Marshal", i), mustJSON(t, a))
				check(fmt.Sprintf("attempt %d slog JSON", i), slogJSON(a))
				if ours(a.Err) {
					check(fmt.Sprintf("attempt %d Err.Error() (ours)", i), a.Err.Error())
				}
			}
			// Attempt.Err stays the original error, for errors.As.
			if tc.name == "refused" {
				var ue *url.Error
				if !errors.As(attempts[0].Err, &ue) || !strings.Contains(ue.URL, plantedKey) {
					t.Errorf("attempt Err = %#v, want the original *url.Error with its URL", attempts[0].Err)
				}
			}
		})
	}
}

// rawText is the text of err's original errors, unredacted: the attempts'
// errors (whose own Error may redact) are read beneath our types.
func rawText(err error) string {
	var b strings.Builder
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if !ours(e) {
			b.WriteString(e.Error())
			b.WriteByte('\n')
		}
		// The chain's errors keep the attempts' errors and the cause as
		// records and fields, not in their trees.
		switch x := e.(type) {
		case *llmretry.Cancelled:
			walk(x.Cause)
			for _, a := range x.Attempts {
				walk(a.Err)
			}
			return
		case *llmretry.Truncated:
			walk(&x.Exhausted)
			return
		case *llmretry.TimedOut:
			walk(x.Cause)
			walk(&x.Exhausted)
			return
		case *llmretry.Exhausted:
			for _, a := range x.Attempts {
				walk(a.Err)
			}
			return
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	return b.String()
}

// ours reports whether err's own type is one of the package's.
func ours(err error) bool {
	switch err.(type) {
	case *llmretry.Failure, *llmretry.Exhausted, *llmretry.Truncated, *llmretry.TimedOut, *llmretry.Cancelled:
		return true
	}
	return false
}

// allAttempts returns err's attempts and, depth-first, those of the inner
// chains their errors came from.
func allAttempts(err error) []llmretry.Attempt {
	var list []llmretry.Attempt
	switch e := err.(type) {
	case *llmretry.Cancelled:
		list = e.Attempts
	case *llmretry.Exhausted:
		list = e.Attempts
	case *llmretry.Truncated:
		list = e.Attempts
	case *llmretry.TimedOut:
		list = e.Attempts
	default:
		return nil
	}
	var all []llmretry.Attempt
	for _, a := range list {
		all = append(all, a)
		all = append(all, allAttempts(a.Err)...)
	}
	return all
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("json.Marshal(%T) error = %v", v, err)
	}
	return string(b)
}

// slogJSON is what slog's JSON handler writes for v.
func slogJSON(v any) string {
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Error("call failed", "v", v)
	return buf.String()
}
