package openairetry_test

import (
	"testing"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// An attempt ended by Backend.Timeout reads as the chain's cause in its
// record, "llmretry: attempt timeout", as in anthropicretry's records,
// not as the SDK's bare "context deadline exceeded", which would not say
// whose deadline passed.
func TestTimeoutNamesItsCause(t *testing.T) {
	t.Parallel()
	steps := map[bool]llmretrytest.Step{false: llmretrytest.StallHeaders(), true: llmretrytest.StreamStall(0)}
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", steps[m.streams()], llmretrytest.Answer("ok"))
			a := backend(m, newClient(srv), "gpt-a", &deltas{})
			a.Retry = waits(1)
			a.Timeout = 300 * time.Millisecond

			answer, attempts, err := run(t, a)
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
			}
			if len(attempts) != 2 || attempts[0].Kind != llmretry.KindTimeout {
				t.Fatalf("records = %v, want a timeout, then the answer", attempts)
			}
			if got, want := attempts[0].Err.Error(), llmretry.ErrAttemptTimeout.Error(); got != want {
				t.Errorf("timed-out record's error = %q, want %q", got, want)
			}
		})
	}
}
