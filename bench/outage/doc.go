// Package outage plays scripted provider outages against llmretry and the
// Go retry libraries people would use instead, and measures outcomes:
// how many requests are answered within their deadline, how soon, and how
// many requests are sent (and billed) to get there.
//
// Everything runs inside a testing/synctest bubble, so provider latencies,
// retry waits, per-attempt timeouts and caller deadlines are timers on the
// bubble's fake clock: minutes of outage with hundreds of concurrent
// callers play in well under a second, and the same seed gives the same
// tables, byte for byte.
//
// # The world
//
// A provider is an http.RoundTripper scripted as phases over virtual time
// (see [Phase]): each phase answers with a status (503 in 0.5 s, 429 in
// 0.2 s, with a Retry-After header when the script says so) or hangs, and
// after its last phase the provider answers 200. A provider may sit
// behind a token bucket shared by all callers, which answers 429 with
// Retry-After set to the time until its next token, rounded up to whole
// seconds as the header carries them, and sends OpenAI's rate-limit
// headers on every answer it decides, 200 and 429 alike: its size, the
// whole requests left after this one, and the time until it is full
// again (OpenAI's meaning of the reset), rounded up to the millisecond,
// all read from the bucket as it stands when it decides. A truncation is a property of the
// request: the same request is cut off at its completion budget by that
// provider every time. Calls honour their context as net/http does: a
// request whose context is done returns at once with the context's error,
// and a generation cut that way is still billed.
//
// Decisions that several callers could race for at the same virtual
// instant (who gets the bucket's last token; whether an answer or the
// caller's deadline came first; what a caller does with the answer it was
// just given) are taken by one dispatcher goroutine after
// [synctest.Wait], one caller at a time in caller order (the caller that
// arrived first goes first), so they never depend on goroutine
// scheduling. The Breaker decides the rest of what callers race for
// (which waiting call gets a half-open probe) by when each call began.
// The tests replay the seed with the dispatcher's order shuffled, as the
// scheduler would order them without it, and want the same tables: an
// outcome that hangs on that order is the library's race, not the world's.
//
// # Strategies
//
// Every strategy is "retry the primary, then fall back to the secondary",
// set up the way its library's own documentation shows, with the same
// budget where the library has the knob: waits of 1, 2, 4 and 8 s, four
// retries per backend, a 30 s per-attempt timeout, retry-after honoured
// where the library shows how, and, under a deadline, 60 s of it for the
// primary through the library's own time knob. Each configuration says
// what it does and why in strategies.go.
//
// # Output
//
// [Play] returns one [Result] per strategy; [WriteMarkdown] prints them as
// a table and [WriteSVG] draws answers and requests sent over time. The
// package's test TestWriteReport -update writes results/outage.md, one
// SVG per scenario and the same report into the repository's
// BENCHMARKS.md, between its markers.
//
// # Fleets
//
// [FleetScenarios] are three scenarios played with their arrivals spread
// over N processes ([FleetSizes]), each with its own chain; the rows of
// [FleetStrategies] differ in what the processes share (fleet.go). The
// test TestWriteFleetReport -update writes results/fleet.md, one SVG and
// the fleet section of BENCHMARKS.md.
//
// # Pools
//
// [PoolScenarios] serve one model from several deployments
// ([Scenario.Deployments]), each behind a bucket of requests and one of
// the model's tokens ([Provider.TokenRate]); every request costs tokens
// ([Tokens]), and the answers report them as usage. The rows of
// [PoolStrategies] are llmretry's Backend.Pool, the same deployments as
// an ordered chain, and four gateways' ways of balancing modelled from
// their documentation (poolrows.go), over fleets of [PoolSizes]
// processes. The test TestWritePoolReport -update writes
// results/pools.md, one picture per scenario and the pools section of
// BENCHMARKS.md; TestPoolTargets holds the pool to the targets.
package outage
