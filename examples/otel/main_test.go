package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRun plays the outage as go run does and checks the printed tree's
// shape: each span's name at its depth, in order, with the attributes
// that tell the story (timings left out: they are the clock's).
func TestRun(t *testing.T) {
	var buf bytes.Buffer
	if err := run(&buf); err != nil {
		t.Fatalf("run() = %v, want nil; output:\n%s", err, buf.String())
	}
	timing := regexp.MustCompile(`  \[[a-z]+ \+\d+ms, \d+ms\].*$`)
	var got []string
	for _, line := range strings.Split(buf.String(), "\n") {
		name := strings.TrimRight(line, " ")
		if strings.HasPrefix(strings.TrimLeft(name, " "), "event ") {
			got = append(got, "event")
			continue
		}
		if !timing.MatchString(name) {
			continue // an answer, attribute or blank line
		}
		got = append(got, timing.ReplaceAllString(name, ""))
	}
	// The call is named for the backend that answered; each request is
	// an inference span, a failed one with its exception, a retried one
	// with its wait.
	want := []string{
		"chat gpt-4o-mini",
		"  chat gpt-4o", "event", "event", "    HTTP POST",
		"  chat gpt-4o", "event", "event", "    HTTP POST",
		"  chat gpt-4o", "event", "    HTTP POST",
		"  chat gpt-4o-mini", "    HTTP POST",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("span tree (-want +got):\n%s\noutput:\n%s", diff, buf.String())
	}
	for _, s := range []string{
		"answer: Paris is the capital of France.",
		"gen_ai.response.model=gpt-4o-mini",
		"llmretry.kind=transient llmretry.next=retry llmretry.retry_in=0.01 llmretry.try=1",
		"http.request.resend_count=2",
		"llmretry.next=fail_over llmretry.try=3 llmretry.why=waits_used",
		// The usage is the answering request's, and only its.
		"gen_ai.usage.input_tokens=10 gen_ai.usage.output_tokens=6 llmretry.backend=1",
	} {
		if !strings.Contains(buf.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, buf.String())
		}
	}
	if n := strings.Count(buf.String(), "gen_ai.usage.input_tokens"); n != 1 {
		t.Errorf("output has gen_ai.usage.input_tokens %d times, want once:\n%s", n, buf.String())
	}
}
