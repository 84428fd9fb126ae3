//go:build race

package pgbreaker_test

// raceEnabled reports whether the tests run under the race detector,
// which makes the core's decisions several times slower.
const raceEnabled = true
