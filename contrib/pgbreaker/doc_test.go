package pgbreaker_test

import (
	"os"
	"strings"
	"testing"

	"github.com/llmretry/llmretry/contrib/pgbreaker"
)

// The package docs quote every statement as it runs, so that what a DBA
// reads there is what the store sends.
func TestDocQuotesStatements(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for name, stmt := range pgbreaker.Statements {
		quoted := "//\t" + strings.ReplaceAll(stmt, "\n", "\n//\t")
		if !strings.Contains(string(doc), quoted) {
			t.Errorf("doc.go does not quote the %s statement as it runs:\n%s", name, quoted)
		}
	}
}
