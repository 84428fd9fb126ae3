//go:build !race

package batch_test

// soakScale stretches TestSoak's timeouts and deadlines; see
// soak_race_test.go.
const soakScale = 1
