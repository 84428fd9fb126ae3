package llmretry

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// The stall timer is stopped for good when its attempt ends, so that a
// goroutine the backend left behind cannot re-arm it after Do returns.
func TestStallTimerStoppedWhenAttemptEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mark *attemptCtx
		c := &Chain[string, string]{Backends: []Backend[string, string]{{
			Model:        "a",
			StallTimeout: time.Second,
			Call: func(ctx context.Context, _ string) (string, error) {
				mark, _ = ctx.Value(markKey{}).(*attemptCtx)
				Delivered(ctx)
				return "", errors.New("stream broke")
			},
		}}}
		c.Do(context.Background(), "hi")
		if mark == nil || mark.stall == nil {
			t.Fatal("the attempt had no stall timer")
		}
		mark.stall.touch() // a late Delivered from a goroutine left behind
		if mark.stall.t.Stop() {
			t.Error("stall timer is armed after Do returned, want it stopped for good")
		}
	})
}
