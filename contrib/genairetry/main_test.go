package genairetry_test

import (
	"io"
	"log"
	"os"
	"testing"
)

// TestMain quiets the standard logger, on which the SDK reports every
// stream that breaks ("Error unexpected EOF"): the tests break streams on
// purpose, and their own output is what should be read.
func TestMain(m *testing.M) {
	log.SetOutput(io.Discard)
	os.Exit(m.Run())
}
