//go:build race

package batch_test

// soakScale stretches TestSoak's timeouts and deadlines: the race
// detector makes each request several times slower, and with the plain
// figures most healthy answers would time out, turning the soak into a
// test of timeouts alone.
const soakScale = 2
