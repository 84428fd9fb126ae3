//go:build !race

package llmretry_test

// raceEnabled reports whether the tests run under the race detector, which
// changes allocation counts and slows some tests down.
const raceEnabled = false
