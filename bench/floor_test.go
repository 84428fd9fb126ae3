package bench

import (
	"context"
	"testing"
	"time"
)

// BenchmarkFloor measures the least that any Do keeping the Core contract
// must do on a successful first attempt, to show where FirstTry's floor
// lies on the machine at hand: time.Now and time.Since are the two clock
// readings a call can take (the attempt's Start must be known should it
// fail), and contract is the minimum itself: one monotonic reading, one
// 32-byte context per attempt (the mark that Delivered and nesting need)
// and the call through a function value. llmretry's FirstTry is this plus
// its own bookkeeping; no library is compared here.
func BenchmarkFloor(b *testing.B) {
	epoch := time.Now()
	b.Run("time.Now", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			floorTime = time.Now()
		}
	})
	b.Run("time.Since", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			floorDur = time.Since(epoch)
		}
	})
	b.Run("contract", func(b *testing.B) {
		ctx, s := context.Background(), new(state)
		b.ReportAllocs()
		for b.Loop() {
			floorDur = time.Since(epoch)
			s.calls = 0
			floorCall(&floorMark{Context: ctx}, s)
		}
	})
}

// floorMark has the size and shape of llmretry's attempt context: the
// caller's context, a parent pointer and two flags, padded.
type floorMark struct {
	context.Context
	_ *floorMark
	_ [8]byte
}

// The floor's results and call go through package variables so that the
// compiler can neither drop the clock readings nor keep the mark on the
// stack.
var (
	floorTime time.Time
	floorDur  time.Duration
	floorCall = fake(0, errTransient)
)
