package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestRun plays the demo on the in-memory store, and on PostgreSQL when
// LLMRETRY_PG_URL is set (as .ci/run sets it), and checks that each
// worker saw what the other's breaker learned: B skipped the backend A
// found down, and A's breaker closed on B's probe.
func TestRun(t *testing.T) {
	tests := []struct {
		name  string
		dbURL string
	}{
		{"memory", ""},
		{"postgres", os.Getenv("LLMRETRY_PG_URL")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "postgres" && tc.dbURL == "" {
				t.Skip("LLMRETRY_PG_URL is not set")
			}
			var buf bytes.Buffer
			if err := run(&buf, tc.dbURL); err != nil {
				t.Fatalf("run() = %v, want nil; output:\n%s", err, buf.String())
			}
			out := buf.String()
			for _, want := range []string{
				"   B: skipped without sending: the breaker is open (breaker)\n   B's breaker: open true, failures 2, opened 1 times\n",
				"   B: sent, answered\n   B's breaker: open false",
				"   A: sent, answered\n   A's breaker: open false, failures 0, opened 1 times\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("run() output lacks %q; output:\n%s", want, out)
				}
			}
		})
	}
}
