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

// Realistic-looking fakes: each has the shape and length of a real key of
// its provider, and none was ever issued.
const (
	openAIKey    = "sk-proj-Ab3dE5gH7jK9mN1pQ3sT5vX7zB9cD1fG3hJ5kL7nP9rS1uW3yZ5aC7eF9iH1kM3oQ5"
	legacyKey    = "sk-Zq81Lw02Xe93Rt64Yu75Io86Pa97Sd08Fg19Hj20Kl31Mn42"
	anthropicKey = "sk-ant-api03-Xy7_Qw3-Er5Ty9Ui1Op3As5Df7Gh9Jk1Lz3Xc5Vb7Nm9Qa2Ws4Ed6Rf8Tg0Yh2Uj4Ik6Ol8P-AbCdEf"
	googleKey    = "AIzaSyD-3fGh7Jk9Lm1Np3Qr5St7Uv9Wx1Yz3Ab5C"
)

func TestRedact(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		// Text with nothing to hide comes back as it was.
		{"empty", "", ""},
		{"plain", "llmretry: backend 1 (gpt-4o): 503 service unavailable", "llmretry: backend 1 (gpt-4o): 503 service unavailable"},
		{"url_without_secret", `Post "https://api.example.com/v1/chat?alt=sse&model=x": EOF`, `Post "https://api.example.com/v1/chat?alt=sse&model=x": EOF`},
		{"email_not_url", "mail bob@example.com about https://example.com/x", "mail bob@example.com about https://example.com/x"},
		{"empty_param_value", "https://h/v1?key=&alt=sse", "https://h/v1?key=&alt=sse"},
		{"other_params", "https://h/v1?monkey=1&keys=2&tokens=3&signed=4", "https://h/v1?monkey=1&keys=2&tokens=3&signed=4"},
		{"words_with_sk", "task-list-with-a-long-kebab-name disk-1234567890abcdefgh ask-anything-you-like-today", "task-list-with-a-long-kebab-name disk-1234567890abcdefgh ask-anything-you-like-today"},
		{"short_sk", "locale sk-SK and sk-short-name", "locale sk-SK and sk-short-name"},
		{"short_aiza", "AIzaShort and AIzaSyD-3fGh7Jk9Lm1Np3Qr5", "AIzaShort and AIzaSyD-3fGh7Jk9Lm1Np3Qr5"},
		{"openai_masked_key", "Incorrect API key provided: sk-proj-****************abcd.", "Incorrect API key provided: sk-proj-****************abcd."},
		{"bearer_alone", "header is Bearer", "header is Bearer"},
		{"bearer_in_word", "forbearer abc", "forbearer abc"},
		{"invalid_utf8", "bad \xff\xfe bytes = ://", "bad \xff\xfe bytes = ://"},

		// URL userinfo.
		{"userinfo", "https://user:pass@host/path", "https://REDACTED@host/path"},
		{"user_only", "http://user@host", "http://REDACTED@host"},
		{"userinfo_raw_at", "https://user:p@ss@host/", "https://REDACTED@host/"},
		{"userinfo_other_scheme", "dial postgres://app:hunter2@db:5432/x failed", "dial postgres://REDACTED@db:5432/x failed"},
		{"userinfo_go_redacted", `Get "https://user:***@host/v1": EOF`, `Get "https://REDACTED@host/v1": EOF`},
		{"userinfo_query_at", "https://host/path?to=a@b", "https://host/path?to=a@b"},
		// Redacting the value first removes the '/' that would otherwise
		// end the userinfo, so both must see the same text on every run.
		{"userinfo_after_param", "s://x&key=/&@h", "s://REDACTED@h"},
		{
			"go_url_error",
			`Post "https://u:p@api.example.com/v1?key=abc": dial tcp 10.0.0.1:443: connect: connection refused`,
			`Post "https://REDACTED@api.example.com/v1?key=REDACTED": dial tcp 10.0.0.1:443: connect: connection refused`,
		},

		// Query parameters.
		{"param_key", "https://h/v1beta/models/g:streamGenerateContent?key=" + googleKey + "&alt=sse", "https://h/v1beta/models/g:streamGenerateContent?key=REDACTED&alt=sse"},
		{"param_after_amp", "https://h/x?alt=sse&api_key=abc#frag", "https://h/x?alt=sse&api_key=REDACTED#frag"},
		{"param_case", "https://h/x?API-KEY=a&ApiKey=b&Access_Token=c&TOKEN=d", "https://h/x?API-KEY=REDACTED&ApiKey=REDACTED&Access_Token=REDACTED&TOKEN=REDACTED"},
		{"param_all_names", "?sig=1&signature=2&secret=3&client_secret=4&password=5&key=6&apikey=7&api_key=8&api-key=9&token=10&access_token=11", "?sig=REDACTED&signature=REDACTED&secret=REDACTED&client_secret=REDACTED&password=REDACTED&key=REDACTED&apikey=REDACTED&api_key=REDACTED&api-key=REDACTED&token=REDACTED&access_token=REDACTED"},
		{"param_sas_signature", "https://acct.blob.example.net/c/b?sv=2024&sig=Ab%2Bc%3D&se=x", "https://acct.blob.example.net/c/b?sv=2024&sig=REDACTED&se=x"},
		{"param_single_quoted", "'https://h/x?token=abc'", "'https://h/x?token=REDACTED'"},
		{"param_at_end", "https://h/x?token=abc", "https://h/x?token=REDACTED"},
		{"param_html_escaped", "https://h/x?a=1&amp;key=abc&amp;b=2", "https://h/x?a=1&amp;key=REDACTED&amp;b=2"},
		{"param_json_escaped", `{"url":"https://h/x?a=1\u0026key=abc\u0026b=2"}`, `{"url":"https://h/x?a=1\u0026key=REDACTED\u0026b=2"}`},

		// Bearer tokens.
		{"bearer", "Authorization: Bearer abc.def", "Authorization: Bearer REDACTED"},
		{"bearer_case", "authorization: BEARER abc.def-ghi_jkl", "authorization: BEARER REDACTED"},
		{"bearer_jwt_quoted", `{"Authorization":"Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln"}`, `{"Authorization":"Bearer REDACTED"}`},
		{"bearer_header_map", "map[Authorization:[Bearer abc123]]", "map[Authorization:[Bearer REDACTED]]"},
		{"bearer_prose", "401: invalid bearer token", "401: invalid bearer REDACTED"},

		// Standalone provider keys.
		{"openai_key", "using " + openAIKey + " now", "using REDACTED now"},
		{"legacy_key", legacyKey, "REDACTED"},
		{"anthropic_key", "x-api-key: " + anthropicKey, "x-api-key: REDACTED"},
		{"google_key", `"` + googleKey + `"`, `"REDACTED"`},
		{"key_in_path", "https://h/keys/" + legacyKey + "/x", "https://h/keys/REDACTED/x"},
		{"keys_adjacent", legacyKey + "," + googleKey + "." + openAIKey, "REDACTED,REDACTED.REDACTED"},
		{"key_in_word", "mask" + legacyKey, "mask" + legacyKey},
		{"key_then_invalid_utf8", "\xff" + legacyKey + "\xfe", "\xffREDACTED\xfe"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := llmretry.Redact(tc.in)
			if got != tc.want {
				t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if again := llmretry.Redact(got); again != got {
				t.Errorf("Redact(%q) = %q, want it unchanged (idempotent)", got, again)
			}
		})
	}
}

// plantings are the forms a secret takes in text, each with %s where the
// secret goes. The secret is a run of letters and digits, so it is a whole
// value, token or key body in every form.
var plantings = []struct {
	name, form string
}{
	{"userinfo", "https://%s:x@api.example.com/v1"},
	{"password", "https://user:%s@api.example.com/v1"},
	{"query_first", "https://api.example.com/v1?key=%s"},
	{"query_later", "https://api.example.com/v1?alt=sse&Access_Token=%s&x=1"},
	{"bearer", "Authorization: bearer %s"},
	{"openai", "sk-proj-%s"},
	{"anthropic", "sk-ant-api03-%s"},
	{"google", "AIza%s"},
}

// plantSecret is the secret the leak tests plant: long enough for every
// key form, and found nowhere else in their text.
const plantSecret = "PLANTEDs3cr3t0123456789abcdefghijklmnop"

func TestRedactLeavesNoSecret(t *testing.T) {
	wrappers := []struct {
		name, wrap string // %s is the planted form
	}{
		{"alone", "%s"},
		{"start", "%s: connection refused"},
		{"end", "request failed: %s"},
		{"middle", "a %s b"},
		{"double_quoted", `Post "%s": EOF`},
		{"single_quoted", "'%s'"},
		{"go_quoted", "%q"},
		{"parenthesised", "(see %s)"},
		{"newlines", "line one\n%s\nline three"},
		{"twice", "%[1]s then %[1]s"},
		{"json", `{"error":{"message":"%s"}}`},
	}
	for _, p := range plantings {
		for _, w := range wrappers {
			t.Run(p.name+"/"+w.name, func(t *testing.T) {
				t.Parallel()
				in := fmt.Sprintf(w.wrap, fmt.Sprintf(p.form, plantSecret))
				got := llmretry.Redact(in)
				if strings.Contains(got, plantSecret) {
					t.Errorf("Redact(%q) = %q, want no %q", in, got, plantSecret)
				}
				if !strings.Contains(got, "REDACTED") {
					t.Errorf("Redact(%q) = %q, want REDACTED in it", in, got)
				}
			})
		}
	}
}

// TestRedactPieces runs Redact on every text of up to five pieces from a
// small set holding what each rule reacts to, where one rule's replacement
// could start or end another's match. The fuzzer rarely builds such
// combinations; here each must be redacted idempotently, and must lose a
// secret planted after it.
func TestRedactPieces(t *testing.T) {
	t.Parallel()
	pieces := []string{
		"://", "@", "/", "&", "#", "&key=", " ", "Bearer ", "sk-0123456789abcdef",
	}
	var check func(text string, depth int)
	check = func(text string, depth int) {
		got := llmretry.Redact(text)
		if again := llmretry.Redact(got); again != got {
			t.Errorf("Redact(%q) = %q, but Redact of that = %q (not idempotent)", text, got, again)
		}
		if depth == 0 {
			return
		}
		for _, p := range pieces {
			check(text+p, depth-1)
		}
	}
	// Five pieces are what the order of the rules needs to show ("://",
	// "&key=", "/", "&", "@"). The race detector makes regexp matching
	// some thirty times slower, which would take seconds at that depth;
	// the runs without it cover depth five.
	depth := 5
	if raceEnabled {
		depth = 4
	}
	check("", depth)

	// The planted forms end at the delimiter after them, whatever the
	// pieces before them are.
	check = func(text string, depth int) {
		for _, p := range plantings {
			in := text + " " + fmt.Sprintf(p.form, plantSecret) + " "
			if got := llmretry.Redact(in); strings.Contains(got, plantSecret) {
				t.Errorf("Redact(%q) = %q, want no %q", in, got, plantSecret)
			}
		}
		if depth == 0 {
			return
		}
		for _, p := range pieces {
			check(text+p, depth-1)
		}
	}
	check("", 3)
}

// TestRedactLarge feeds Redact a quarter megabyte at a time: many secrets
// in a row, one very long key, and clean text.
func TestRedactLarge(t *testing.T) {
	t.Parallel()
	const n = 1 << 18
	unit := `Post "https://u:p@h/v1?key=abc&alt=sse": Bearer t ` + legacyKey + "\n"
	wantUnit := `Post "https://REDACTED@h/v1?key=REDACTED&alt=sse": Bearer REDACTED REDACTED` + "\n"
	in := strings.Repeat(unit, n/len(unit))
	if got, want := llmretry.Redact(in), strings.Repeat(wantUnit, n/len(unit)); got != want {
		t.Errorf("Redact(%d repeats of %q) differs from %d repeats of %q", n/len(unit), unit, n/len(unit), wantUnit)
	}

	long := "key: sk-" + strings.Repeat("a1_-", n/4) + "."
	if got, want := llmretry.Redact(long), "key: REDACTED."; got != want {
		t.Errorf("Redact(one %d-byte key) = %.40q..., want %q", len(long), got, want)
	}

	clean := strings.Repeat("connection reset by peer; ", n/26)
	if got := llmretry.Redact(clean); got != clean {
		t.Errorf("Redact(%d bytes of clean text) changed it", len(clean))
	}
}

// TestRedactCleanAllocations checks that text without secrets, including
// text that has a trigger (a URL, an '=', the word "bearer", "sk-") but no
// secret, comes back unchanged and without an allocation.
func TestRedactCleanAllocations(t *testing.T) {
	if raceEnabled {
		// regexp keeps its matchers in a sync.Pool, which drops items at
		// random under the race detector, so MatchString allocates there.
		t.Skip("allocations are not measurable under the race detector")
	}
	tests := []struct {
		name string
		in   string
	}{
		{"no_trigger", "llmretry: backend 2 (claude-sonnet): 529 overloaded"},
		{"url", `Post "https://api.example.com/v1/chat/completions?alt=sse": context deadline exceeded`},
		{"bearer_word", "no bearer-token auth configured; forbearer"},
		{"sk_word", "disk-full and task-list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			allocs := testing.AllocsPerRun(100, func() {
				got = llmretry.Redact(tc.in)
			})
			if got != tc.in {
				t.Errorf("Redact(%q) = %q, want it unchanged", tc.in, got)
			}
			if allocs != 0 {
				t.Errorf("Redact(%q) made %v allocations, want 0", tc.in, allocs)
			}
		})
	}
}

func BenchmarkRedact(b *testing.B) {
	benchmarks := []struct {
		name string
		in   string
	}{
		{"clean", "llmretry: backend 2 (claude-sonnet): 529 overloaded: the service is temporarily overloaded"},
		{"clean_url", `Post "https://api.example.com/v1/chat/completions?alt=sse": dial tcp 10.0.0.1:443: connect: connection refused`},
		{"secrets", `Post "https://u:p@api.example.com/v1?key=` + googleKey + `&alt=sse": 401: Bearer ` + legacyKey},
	}
	for _, bm := range benchmarks {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bm.in)))
			for b.Loop() {
				llmretry.Redact(bm.in)
			}
		})
	}
}

// FuzzRedact checks, for any text, that Redact does not panic and is
// idempotent, and that a secret planted into the text in any of the forms
// Redact knows, set off by a delimiter on each side, is gone afterwards.
func FuzzRedact(f *testing.F) {
	f.Add("", uint8(0), uint8(0), uint(0))
	f.Add(`Post "https://u:p@api.example.com/v1?key=abc&alt=sse": EOF`, uint8(1), uint8(2), uint(5))
	f.Add("Authorization: Bearer abc.def "+legacyKey, uint8(4), uint8(3), uint(14))
	f.Add("bad \xff\xfe "+googleKey+" s://x&key=/&@", uint8(7), uint8(7), uint(3))
	f.Add("task-list disk-1 ?token= sk-", uint8(5), uint8(1), uint(100))
	f.Fuzz(func(t *testing.T, text string, form, delim uint8, at uint) {
		got := llmretry.Redact(text)
		if again := llmretry.Redact(got); again != got {
			t.Fatalf("Redact(%q) = %q, but Redact of that = %q (not idempotent)", text, got, again)
		}

		if strings.Contains(text, plantSecret) {
			t.Skip("the text already holds the secret")
		}
		// Delimiters that end every form's value, token or key run, so
		// that the text around cannot lengthen the planted secret.
		const delims = " \t\n\"'`<>"
		d := string(delims[int(delim)%len(delims)])
		i := int(at % uint(len(text)+1))
		planted := fmt.Sprintf(plantings[int(form)%len(plantings)].form, plantSecret)
		in := text[:i] + d + planted + d + text[i:]
		if got := llmretry.Redact(in); strings.Contains(got, plantSecret) {
			t.Errorf("Redact(%q) = %q, want no %q", in, got, plantSecret)
		}
	})
}

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

// A model's output that echoes keys pasted into the prompt keeps them in
// Attempt.RawText, for the caller; no rendering of the record or of the
// errors that carry it shows them.
func TestNoSecretsInRawTextRenderings(t *testing.T) {
	// Each planted form is one Redact catches, with "PLANTED" in it.
	raw := "the key you pasted is sk-abcdefghijklmnoPLANTEDxyz012345; " +
		"the Anthropic one sk-ant-api03-PLANTED_Qw3-Er5Ty9Ui1Op3As5Df7; " +
		"Authorization: Bearer " + plantedBearer + "; " +
		"https://user:" + plantedPassword + "@example.com/?key=" + plantedKey
	parse := func(context.Context, string) (string, error) {
		return "", llmretry.ParseFailure(raw, errors.New("invalid JSON"))
	}
	cut := func(context.Context, string) (string, error) { return "", llmretry.Truncation(raw) }
	refused := func(context.Context, string) (string, error) {
		f := llmretry.Refusal("finish_reason content_filter")
		f.RawText = &raw
		return "", f
	}
	innerChain := &chain{Backends: []backend{{Model: "inner", Call: parse}}}
	tests := []struct {
		name     string
		backends []backend
		cancel   bool
	}{
		{name: "parse", backends: []backend{{Model: "m", Call: parse}}},
		{name: "truncated", backends: []backend{{Model: "m", Call: cut}}},
		{name: "refused", backends: []backend{{Model: "m", Call: refused}}},
		{name: "nested", backends: []backend{{Model: "outer", Call: innerChain.Do}}},
		{name: "cancelled", backends: []backend{{Model: "m", Call: func(ctx context.Context, _ string) (string, error) {
			return "", fmt.Errorf("%w", &llmretry.Failure{Kind: llmretry.KindCancelled, RawText: &raw, Err: context.Canceled})
		}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var seen []llmretry.Attempt
			c := &chain{Backends: tc.backends, OnAttempt: func(_ context.Context, a llmretry.Attempt) { seen = append(seen, a) }}
			_, err := c.Do(context.Background(), "hi")
			if err == nil {
				t.Fatal("Do() = nil error, want one")
			}
			attempts := append(allAttempts(err), seen...)
			kept := false
			for _, a := range attempts {
				kept = kept || (a.RawText != nil && *a.RawText == raw)
			}
			if !kept {
				t.Fatalf("no attempt of %v kept the raw output whole: the test plants nothing", err)
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
			check("slog text of the error", slogText(err))
			check("json.Marshal(attempts)", mustJSON(t, attempts))
			for i, a := range attempts {
				check(fmt.Sprintf("attempt %d String()", i), a.String())
				check(fmt.Sprintf("attempt %d fmt %%v", i), fmt.Sprintf("%v", a))
				check(fmt.Sprintf("attempt %d json.Marshal", i), mustJSON(t, a))
				check(fmt.Sprintf("attempt %d slog JSON", i), slogJSON(a))
				check(fmt.Sprintf("attempt %d slog text", i), slogText(a))
			}
			// The JSON still decodes, and holds the redacted output.
			var back llmretry.Attempt
			if err := json.Unmarshal([]byte(mustJSON(t, attempts[0])), &back); err != nil {
				t.Fatalf("json.Unmarshal of an attempt error: %v", err)
			}
			if attempts[0].RawText != nil {
				if back.RawText == nil || *back.RawText != llmretry.Redact(*attempts[0].RawText) {
					t.Errorf("decoded RawText = %v, want %q", back.RawText, llmretry.Redact(*attempts[0].RawText))
				}
			}
		})
	}
}

// slogText is what slog's text handler writes for v.
func slogText(v any) string {
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Error("call failed", "v", v)
	return buf.String()
}
