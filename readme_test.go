package llmretry_test

import (
	"os"
	"path"
	"regexp"
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

// The README's go get lines offer exactly the modules RELEASING.md's table
// tags, at the table's version: a module the README offers and a release
// does not tag is one no user can install (.ci/outside-user installs the
// README's lines from a proxy that serves only the table), and a module
// tagged but never offered is one no user hears of.
func TestREADMEOffersWhatIsReleased(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	releasing, err := os.ReadFile("RELEASING.md")
	if err != nil {
		t.Fatal(err)
	}
	// A row of RELEASING.md's table, as .ci/published reads it.
	row := regexp.MustCompile("(?m)^\\| *`(github\\.com/llmretry/llmretry[^`]*)` *\\| *`([^`]*)` *\\|")
	tagged := map[string]string{} // module path: the version its tag names
	for _, m := range row.FindAllStringSubmatch(string(releasing), -1) {
		tagged[m[1]] = path.Base(m[2]) // "v0.1.0" of "contrib/x/v0.1.0"
	}
	if len(tagged) == 0 {
		t.Fatal("RELEASING.md has no row | `github.com/llmretry/llmretry...` | `TAG` |")
	}
	get := regexp.MustCompile(`(?m)^go get (\S+)@(\S+)`)
	offered := map[string]bool{}
	for _, m := range get.FindAllStringSubmatch(string(readme), -1) {
		module, version := m[1], m[2]
		offered[module] = true
		want, ok := tagged[module]
		switch {
		case !ok:
			t.Errorf("README.md: go get %s@%s, but RELEASING.md does not tag %s", module, version, module)
		case version != want:
			t.Errorf("README.md: go get %s@%s, but RELEASING.md tags it at %s", module, version, want)
		}
	}
	for module := range tagged {
		if !offered[module] {
			t.Errorf("RELEASING.md tags %s, but README.md has no go get line for it", module)
		}
	}
}
