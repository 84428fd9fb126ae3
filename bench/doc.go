// Package bench compares the cost of llmretry's Chain with the Go retry
// libraries people already use, doing the same work through each of them.
//
// It holds no code of its own: the benchmarks live in bench_test.go, and
// run.sh runs them and prints the table. It is a module of its own so that
// the peers never enter llmretry's go.mod. Outcomes rather than overhead
// (answered, how fast, at what cost, during scripted outages in virtual
// time) are measured by the package outage beside it.
//
// # Cases
//
// Every case has one sub-benchmark per library, named direct (a hand-written
// loop: the floor), llmretry, failsafe-go, backoff-v5, backoff-v7,
// retry-go-v4, retry-go-v5 and go-retry, so `go test -bench 'FirstTry/'`
// lines up with anyone's script:
//
//   - FirstTry: one backend with a retry policy, success on the first try.
//   - FirstTryDeadline: FirstTry with a context of its own per request,
//     each with a deadline, as agent hosts and job queues call. Libraries
//     that hold the context in their configuration (failsafe-go, retry-go
//     v4 and v5) bind each request's per call, the cheapest way each API
//     allows.
//   - TwoFailures: one backend fails twice, then answers.
//   - Failover: three backends; the first two fail once each with an error
//     that is not retryable there, the third answers.
//   - Exhausted: three backends of three tries each, all failing.
//   - TwoFailuresWaiting, ExhaustedWaiting: the same work with a 1ns wait,
//     so that every library, llmretry included, arms a timer per retry
//     (llmretry arms none for a zero wait; the peers always do).
//   - Parked: many concurrent calls (100,000; 10,000 with -short) parked
//     in a long retry wait; reports the live heap bytes (B/parked),
//     objects (allocs/parked) and goroutine stack bytes (stack-B/parked)
//     each parked call holds. run.sh sets GODEBUG=adaptivestackstart=0 so
//     that stacks start at 2 KiB whatever ran before.
//   - Waiting/{in_line,retry}: llmretry alone (the peers have no Breaker):
//     many calls waiting in the line of an open Breaker, and many waiting
//     for their retry after a failure that told a Breaker a rate-limit
//     report; the same figures per waiting call (B/waiting,
//     allocs/waiting, stack-B/waiting).
//   - WaitPrecision/{1ms,10ms,100ms}: the real clock; reports how far each
//     library's wait overshoots the asked length (over-p50-ns, over-p99-ns),
//     with direct using time.Sleep as the reference.
//
// # Fairness
//
// Each peer is set up the way its own documentation shows, built once
// outside the timed loop wherever the library allows reuse, with zero
// waits (go-retry refuses a zero constant, so it gets one nanosecond) and
// with the failing errors allocated once and marked retryable (or not) in
// that library's own idiom. Where a peer has no fallback of its own, the
// backends are tried by a plain loop around it.
package bench
