package llmretrytest

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// status is the response's status code, or 0 when there was none.
func (r result) status() int {
	if r.resp == nil {
		return 0
	}
	return r.resp.StatusCode
}

// Each model plays its own script in order, the last step repeats, and
// the log records every request with its model, API, stream flag, number
// and step, in arrival order.
func TestScriptAndLog(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("gpt", Status(503), Status(429).WithHeader("retry-after", "0"), Answer("ok"))
	s.Script("claude", Status(529), Answer("fine"))
	c := newClient(t)
	calls := []struct {
		api    string
		model  string
		stream bool
		want   int
	}{
		{"openai", "gpt", false, 503},
		{"anthropic", "claude", true, 529},
		{"openai", "gpt", true, 429},
		{"openai", "gpt", false, 200},
		{"anthropic", "claude", false, 200},
		{"openai", "gpt", true, 200},       // the last step repeats
		{"anthropic", "claude", true, 200}, // and for the other model too
		{"openai", "unknown", false, 404},
		{"anthropic", "gpt", false, 200}, // the script is the model's, whatever the API
	}
	for i, cl := range calls {
		if got := call(t, c, s, cl.api, cl.model, cl.stream); got.err != nil || got.status() != cl.want {
			t.Fatalf("call %d (%s %s): status %d, err %v; want %d", i, cl.api, cl.model, got.status(), got.err, cl.want)
		}
	}
	want := []Request{
		{Model: "gpt", API: "openai", N: 1, Step: "status 503"},
		{Model: "claude", API: "anthropic", Stream: true, N: 1, Step: "status 529"},
		{Model: "gpt", API: "openai", Stream: true, N: 2, Step: "status 429"},
		{Model: "gpt", API: "openai", N: 3, Step: "answer"},
		{Model: "claude", API: "anthropic", N: 2, Step: "answer"},
		{Model: "gpt", API: "openai", Stream: true, N: 4, Step: "answer"},
		{Model: "claude", API: "anthropic", Stream: true, N: 3, Step: "answer"},
		{Model: "unknown", API: "openai", N: 1, Step: "status 404"},
		{Model: "gpt", API: "anthropic", N: 5, Step: "answer"},
	}
	got := s.Requests()
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Request{}, "Time", "Header", "Usage")); diff != "" {
		t.Errorf("Requests() (-want +got):\n%s", diff)
	}
	checkTimes(t, got)
}

// checkTimes checks that the log is in time order and every time is set.
func checkTimes(t *testing.T, log []Request) {
	t.Helper()
	for i, r := range log {
		if r.Time.IsZero() {
			t.Errorf("request %d has no time", i)
		}
		if i > 0 && r.Time.Before(log[i-1].Time) {
			t.Errorf("request %d at %v is before request %d at %v", i, r.Time, i-1, log[i-1].Time)
		}
	}
}

// Requests returns a copy: changing it does not change the log.
func TestRequestsIsACopy(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("hi"))
	call(t, newClient(t), s, "openai", "m", false)
	first := s.Requests()
	first[0].Model = "changed"
	if got := s.Requests()[0].Model; got != "m" {
		t.Errorf("Requests()[0].Model = %q after changing a copy, want m", got)
	}
}

// Script replaces a model's script, which starts again from its first
// step, while N keeps counting; no steps removes it. The server keeps its
// own copy of the steps.
func TestScriptReplace(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	c := newClient(t)
	steps := []Step{Status(500), Answer("a")}
	s.Script("m", steps...)
	steps[0] = Status(418) // must not reach the server's script
	statuses := func(n int) []int {
		var out []int
		for range n {
			out = append(out, call(t, c, s, "openai", "m", false).status())
		}
		return out
	}
	if diff := cmp.Diff([]int{500, 200}, statuses(2)); diff != "" {
		t.Errorf("first script (-want +got):\n%s", diff)
	}
	s.Script("m", Status(502), Status(503))
	if diff := cmp.Diff([]int{502, 503, 503}, statuses(3)); diff != "" {
		t.Errorf("replaced script (-want +got):\n%s", diff)
	}
	s.Script("m")
	if diff := cmp.Diff([]int{404}, statuses(1)); diff != "" {
		t.Errorf("removed script (-want +got):\n%s", diff)
	}
	var ns []int
	for _, r := range s.Requests() {
		ns = append(ns, r.N)
	}
	if diff := cmp.Diff([]int{1, 2, 3, 4, 5, 6}, ns); diff != "" {
		t.Errorf("N (-want +got):\n%s", diff)
	}
}

// A model without a script gets a 404 in the provider's shape.
func TestUnknownModel(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	c := newClient(t)
	tests := []struct {
		api  string
		want string
	}{
		{"openai", `{"error":{"message":"The model ` + "`nobody`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`},
		{"anthropic", `{"type":"error","error":{"type":"not_found_error","message":"model: nobody"}}`},
	}
	for _, tc := range tests {
		for _, stream := range []bool{false, true} {
			got := call(t, c, s, tc.api, "nobody", stream)
			if got.err != nil || got.status() != http.StatusNotFound {
				t.Fatalf("%s stream=%v: status %d, err %v; want 404", tc.api, stream, got.status(), got.err)
			}
			if diff := cmp.Diff(decode(t, []byte(tc.want)), decode(t, got.body)); diff != "" {
				t.Errorf("%s stream=%v: body (-want +got):\n%s", tc.api, stream, diff)
			}
		}
	}
}

// The request id names the model, with characters that would not do in an
// id replaced, and the request's number.
func TestRequestID(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	c := newClient(t)
	s.Script("org/model v2:beta", Answer("hi"))
	for i, want := range []string{"req_org_model_v2_beta_1", "req_org_model_v2_beta_2"} {
		got := call(t, c, s, "openai", "org/model v2:beta", false)
		if id := got.resp.Header.Get("X-Request-Id"); id != want {
			t.Errorf("request %d: x-request-id = %q, want %q", i+1, id, want)
		}
	}
}

// Concurrent requests each play a different step, in the order the server
// read them, and all are logged.
func TestConcurrentRequests(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	const n = 40
	for _, model := range []string{"a", "b"} {
		var steps []Step
		for i := range n {
			steps = append(steps, Answer(fmt.Sprint(model, i)))
		}
		s.Script(model, steps...)
	}
	c := newClient(t)
	var wg sync.WaitGroup
	texts := make([]string, 2*n)
	for i := range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model, api := "a", "openai"
			if i%2 == 1 {
				model, api = "b", "anthropic"
			}
			got := send(t.Context(), c, s, paths[api], requestBody(api, model, i%3 == 0))
			if got.err != nil || got.status() != 200 {
				t.Errorf("request %d: status %d, err %v", i, got.status(), got.err)
				return
			}
			texts[i] = string(got.body)
		}()
	}
	wg.Wait()
	// Every step was played exactly once: each answer's text appears in
	// exactly one response.
	for _, model := range []string{"a", "b"} {
		for i := range n {
			word := fmt.Sprint(model, i)
			count := 0
			for _, body := range texts {
				// The text is one word, sent whole in JSON and in a stream.
				if strings.Contains(body, `"`+word+`"`) {
					count++
				}
			}
			if count != 1 {
				t.Errorf("answer %q sent %d times, want 1", word, count)
			}
		}
	}
	log := s.Requests()
	if len(log) != 2*n {
		t.Fatalf("len(Requests()) = %d, want %d", len(log), 2*n)
	}
	checkTimes(t, log)
	ns := map[string][]int{}
	for _, r := range log {
		ns[r.Model] = append(ns[r.Model], r.N)
	}
	for model, got := range ns {
		if !slices.IsSorted(got) || len(got) != n || got[0] != 1 || got[n-1] != n {
			t.Errorf("N of %s in log order = %v, want 1..%d", model, got, n)
		}
	}
}

// The base URLs are what the SDKs join their paths to: openai-go appends
// "chat/completions", anthropic-sdk-go "v1/messages".
func TestBaseURLs(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("hi"))
	c := newClient(t)
	if !strings.HasPrefix(s.URL, "http://127.0.0.1:") || strings.HasSuffix(s.URL, "/") {
		t.Errorf("URL = %q, want http://127.0.0.1:PORT", s.URL)
	}
	for _, url := range []string{s.OpenAIBaseURL() + "chat/completions", s.AnthropicBaseURL() + "v1/messages"} {
		resp, err := c.Post(url, "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("POST %s: status %d, want 200", url, resp.StatusCode)
		}
	}
}

// Script, Requests and GoDown may be called while requests are served;
// the race detector checks the locking.
func TestMethodsWhileServing(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("a b c"))
	c := newClient(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				api := []string{"openai", "anthropic"}[i%2]
				send(t.Context(), c, s, paths[api], requestBody(api, "m", i%4 < 2))
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			s.Script("m", Answer(fmt.Sprint("a", i)), Status(503))
			_ = s.Requests()
		}
		s.GoDown()
	}()
	wg.Wait()
	// Every logged request has a number one above the one before it.
	for i, r := range s.Requests() {
		if r.N != i+1 {
			t.Fatalf("request %d has N %d, want %d", i, r.N, i+1)
		}
	}
}

// The log keeps each request's header as the server read it, whatever
// the step and even for a body it could not use, so a client can match
// its own marks; and each Requests call hands out its own copy.
func TestRequestHeader(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("gpt", Status(503), Answer("ok"))
	c := newClient(t)
	bodies := []string{
		requestBody("openai", "gpt", false),
		requestBody("anthropic", "gpt", true),
		"not json",
	}
	for i, body := range bodies {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL+paths["openai"], strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Mark", fmt.Sprint("request ", i))
		req.Header.Add("X-Mark", "again")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	got := s.Requests()
	if len(got) != len(bodies) {
		t.Fatalf("Requests() has %d requests, want %d", len(got), len(bodies))
	}
	for i, r := range got {
		want := []string{fmt.Sprint("request ", i), "again"}
		if diff := cmp.Diff(want, r.Header.Values("X-Mark")); diff != "" {
			t.Errorf("request %d: Header X-Mark (-want +got):\n%s", i, diff)
		}
		if r.Header.Get("User-Agent") == "" {
			t.Errorf("request %d: Header has no User-Agent: %v", i, r.Header)
		}
	}
	got[0].Header.Set("X-Mark", "changed")
	if v := s.Requests()[0].Header.Get("X-Mark"); v != "request 0" {
		t.Errorf("after changing a copy, the log's X-Mark = %q, want %q", v, "request 0")
	}
}
