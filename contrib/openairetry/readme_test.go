package openairetry_test

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// The README's pool is the one Example_pool compiles, character for
// character, so that the README cannot drift from code that builds.
func TestREADMEPoolCompiles(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("the README is the repository's: this module on its own has none")
	}
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, b := range strings.Split(string(readme), "```go\n")[1:] {
		code, _, _ := strings.Cut(b, "```")
		if strings.Contains(code, "Pool: []llmretry.Deployment") {
			block = code
			break
		}
	}
	if block == "" {
		t.Fatal("README.md has no Go block that builds a Pool")
	}
	// The example is indented once more, inside its function.
	indented := "\t" + strings.ReplaceAll(strings.TrimSuffix(block, "\n"), "\n", "\n\t") + "\n"
	if !strings.Contains(string(example), indented) {
		t.Errorf("the README's pool is not in example_test.go as written:\n%s", block)
	}
}
