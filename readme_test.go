package llmretry_test

import (
	"os"
	"strings"
	"testing"
)

// The README's handlers are the ones the examples compile and run,
// character for character, so that the README cannot drift from code
// that builds: the HTTPStatus handler is ExampleHTTPStatus's, the
// streaming handler ExampleChain_Stream's.
func TestREADMEHandlerCompiles(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, marker, file string
	}{
		{"httpstatus", "llmretry.HTTPStatus(err)\n\t\t\tif after", "example_httpstatus_test.go"},
		{"stream", "chain.Stream(r.Context()", "example_stream_test.go"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			example, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			var block string
			for _, b := range strings.Split(string(readme), "```go\n")[1:] {
				code, _, _ := strings.Cut(b, "```")
				if strings.Contains(code, tc.marker) {
					block = code
					break
				}
			}
			if block == "" {
				t.Fatalf("README.md has no Go block with %q", tc.marker)
			}
			if !strings.Contains(string(example), block) {
				t.Errorf("the README's handler is not in %s as written:\n%s", tc.file, block)
			}
		})
	}
}
