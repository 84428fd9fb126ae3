package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRun plays the demo over loopback, as go run does, and checks what
// it prints: where each request went and why, in order, and that no
// request drew a 429.
func TestRun(t *testing.T) {
	var buf bytes.Buffer
	if err := run(&buf); err != nil {
		t.Fatalf("run() = %v, want nil; output:\n%s", err, buf.String())
	}
	out := buf.String()
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^(\d+)\s+(\S+)\s+(\S+)\s+(\S+)$`).FindAllStringSubmatch(out, -1) {
		got = append(got, strings.Join(m[1:], " "))
	}
	want := []string{
		"1 key-a order answered",    // nothing reported yet: the first in order
		"2 key-b headroom answered", // key-a has 1 of 2 left; key-b, unknown, stands as full
		"3 key-a order answered",    // both 1 of 2
		"4 key-b tier answered",     // key-a has none left
		"5 paygo spill answered",    // neither key has any
		"6 paygo spill answered",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s\noutput:\n%s", diff, out)
	}
	for _, line := range []string{
		"key-a got 2 requests: answer, answer",
		"key-b got 2 requests: answer, answer",
		"paygo got 2 requests: answer, answer",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("output has no line %q; output:\n%s", line, out)
		}
	}
}
