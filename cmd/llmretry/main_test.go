package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// script is how each kind of item fares on both providers, on every run:
// the item's ID is its kind and a number.
func script(id string) error {
	header := func(k, v string) http.Header { return http.Header{k: {v}} }
	kind, _, _ := strings.Cut(id, "-")
	switch kind {
	case "long":
		cut := llmretry.Truncation("The customer reports, at length, that")
		cut.Usage = &llmretry.Usage{InputTokens: 30, OutputTokens: 256}
		return cut
	case "broken":
		return llmretry.StatusFailure(500, nil, errors.New("internal error"))
	case "limited":
		return llmretry.StatusFailure(429, header("Retry-After", "60"), errors.New("rate limited"))
	case "quota":
		return llmretry.StatusFailure(429, header("X-Should-Retry", "false"), errors.New("insufficient_quota, key sk-Zq81Lw02Xe93Rt64Yu75Io86"))
	case "filtered":
		return llmretry.Refusal("finish_reason content_filter")
	}
	return nil
}

// writeDeadLetters runs a batch, in virtual time, through two providers
// that fail as script says, and writes its dead letters with
// batch.JSONLines to path. Every item starts at once, so the file is the
// same on every run but for the order of its lines.
func writeDeadLetters(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	provider := func(input int64) func(context.Context, string) (string, error) {
		return func(ctx context.Context, id string) (string, error) {
			took := time.Second
			if strings.HasPrefix(id, "slow-") {
				took = time.Hour // the backend's Timeout ends it
			}
			t := time.NewTimer(took)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			if err := script(id); err != nil {
				return "", err
			}
			llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: input, OutputTokens: 20})
			return "an answer", nil
		}
	}
	chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
		{Model: "gpt-4o", Call: provider(30), Timeout: 10 * time.Second},
		{Model: "claude-sonnet-4-5", Call: provider(40), Timeout: 10 * time.Second},
	}}
	var items []batch.Item[string]
	for _, kind := range []string{"ok", "long", "broken", "limited", "quota", "filtered", "slow"} {
		for i := range 3 {
			id := fmt.Sprintf("%s-%d", kind, i+1)
			items = append(items, batch.Item[string]{ID: id, Req: id})
		}
	}
	r := &batch.Runner[string, string]{
		Chain:       chain,
		Concurrency: len(items),
		Waits:       []time.Duration{10 * time.Second},
		Dead:        batch.JSONLines(f),
	}
	counts, err := r.Run(context.Background(), slices.Values(items))
	if err != nil || counts.Dead != 18 {
		t.Fatalf("Run() = %+v, %v; want 18 dead, nil", counts, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// The command summarises a dead-letter file that the batch runner wrote,
// as testdata/deadletters.golden says, and writes the IDs worth running
// again. The summary is taken at the moment the batch ended, in virtual
// time, so the waits advised are exact.
func TestDeadLetters(t *testing.T) {
	t.Chdir(t.TempDir()) // so that the summary names the file as given
	synctest.Test(t, func(t *testing.T) {
		writeDeadLetters(t, "dead.jsonl")
		var stdout, stderr bytes.Buffer
		if code := run([]string{"deadletters", "-ids", "rerun.txt", "dead.jsonl"}, &stdout, &stderr); code != 0 {
			t.Fatalf("deadletters exit code %d, stderr:\n%s", code, stderr.String())
		}
		golden(t, "deadletters.golden", stdout.String())
		if stderr.Len() != 0 {
			t.Errorf("stderr = %q, want nothing", stderr.String())
		}
		ids, err := os.ReadFile("rerun.txt")
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Fields(string(ids))
		slices.Sort(got) // the file's order is the order the items ended in
		want := []string{"broken-1", "broken-2", "broken-3", "limited-1", "limited-2", "limited-3", "slow-1", "slow-2", "slow-3"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("IDs written (-want +got):\n%s", diff)
		}

		// With -ids -, the IDs go to standard output and the summary to
		// standard error.
		stdout.Reset()
		stderr.Reset()
		if code := run([]string{"deadletters", "-ids", "-", "dead.jsonl"}, &stdout, &stderr); code != 0 {
			t.Fatalf("deadletters -ids - exit code %d, stderr:\n%s", code, stderr.String())
		}
		if stdout.String() != string(ids) {
			t.Errorf("deadletters -ids - stdout = %q, want the IDs %q", stdout.String(), ids)
		}
		if !strings.HasPrefix(stderr.String(), "18 dead letters in dead.jsonl\n") {
			t.Errorf("deadletters -ids - stderr = %q, want the summary", stderr.String())
		}
	})
}

// golden compares got with the file testdata/name, or rewrites it with
// -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join(testdataDir, name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("output differs from %s (-want +got):\n%s", path, diff)
	}
}

// testdataDir is the package's testdata folder, found before a test
// changes directory.
var testdataDir = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Join(wd, "testdata")
}()

// A command line it does not understand, a file it cannot read and a file
// that is not dead letters each get an error that says so, and their exit
// code.
func TestDeadLettersErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"id":"a","runs":1}`+"\n"+`{"id":"b","runs":"two"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string // a prefix of it
	}{
		{"no_command", nil, 2, "", "usage: llmretry deadletters"},
		{"unknown_command", []string{"deadletter"}, 2, "", `llmretry: unknown command "deadletter"`},
		{"help", []string{"-h"}, 0, "usage: llmretry deadletters", ""},
		{"deadletters_help", []string{"deadletters", "-h"}, 0, "", "usage: llmretry deadletters [-ids FILE] DEADLETTERS"},
		{"no_file", []string{"deadletters"}, 2, "", "llmretry: deadletters takes one dead-letter file"},
		{"two_files", []string{"deadletters", empty, empty}, 2, "", "llmretry: deadletters takes one dead-letter file"},
		{"bad_flag", []string{"deadletters", "-id", "x", empty}, 2, "", "flag provided but not defined: -id"},
		{"missing", []string{"deadletters", filepath.Join(dir, "none.jsonl")}, 1, "", "llmretry: open " + filepath.Join(dir, "none.jsonl") + ": no such file or directory"},
		{"not_dead_letters", []string{"deadletters", bad}, 1, "", "llmretry: " + bad + `: batch: reading dead letters: line 2: field "runs": want a number, got string`},
		{"ids_unwritable", []string{"deadletters", "-ids", filepath.Join(dir, "no", "ids.txt"), empty}, 1, "0 dead letters in", "llmretry: open " + filepath.Join(dir, "no", "ids.txt")},
		{"empty", []string{"deadletters", empty}, 0, "0 dead letters in " + empty + "\n\nbilled over the 0 runs kept: 0 tokens in, 0 out; 0 attempts of unknown cost\n\nworth running again: 0 of 0\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if code != tc.wantCode || !strings.HasPrefix(stdout.String(), tc.wantStdout) || !strings.HasPrefix(stderr.String(), tc.wantStderr) ||
				(tc.wantStderr == "" && stderr.Len() != 0) || (tc.wantStdout == "" && stdout.Len() != 0) {
				t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d, stdout starting %q, stderr starting %q",
					tc.args, code, stdout.String(), stderr.String(), tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
		})
	}
}
