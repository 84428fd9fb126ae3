package llmretry_test

import (
	"os"
	"strings"
	"testing"
)

// The README's handler is the one ExampleHTTPStatus compiles and runs,
// character for character, so that the README cannot drift from code
// that builds.
func TestREADMEHandlerCompiles(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_httpstatus_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, b := range strings.Split(string(readme), "```go\n")[1:] {
		code, _, _ := strings.Cut(b, "```")
		if strings.Contains(code, "llmretry.HTTPStatus(err)") {
			block = code
			break
		}
	}
	if block == "" {
		t.Fatal("README.md has no Go block that calls llmretry.HTTPStatus(err)")
	}
	if !strings.Contains(string(example), block) {
		t.Errorf("the README's handler is not in example_httpstatus_test.go as written:\n%s", block)
	}
}
