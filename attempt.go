package llmretry

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"
)

// Attempt is the record of one request to one backend. The chain's errors
// carry one per failed attempt, in order, and [Chain.OnAttempt] sees every
// attempt as it ends. Attempts encode to JSON (snake_case keys, durations
// as *_ms numbers) for job queues and dead-letter tables, and log as slog
// groups without the model's output.
type Attempt struct {
	Backend   int           // 0-based position in the chain
	Model     string        // the backend's Model, or "unknown"
	Try       int           // 1 for the first request to this backend, 2 for its first retry, ...
	Kind      Kind          // how it failed; the zero Kind for a success
	Status    int           // HTTP status when known
	Err       error         // the backend's error as it returned it; nil for a success
	RawText   *string       // absent (nil) when there was no body worth keeping; present, even "", otherwise
	Start     time.Time     // when the request was sent
	Elapsed   time.Duration // how long the request took
	RetryIn   time.Duration // the wait before the next try of this backend; 0 when none followed
	Delivered bool          // the attempt had already delivered output to the caller (see Delivered)
}

// String returns the attempt as one line, "[backend 0 gpt-4o try 1] http
// 500: upstream on fire": where it ran, then the error's message, or "ok"
// for a success.
func (a Attempt) String() string {
	msg := "ok"
	if a.Err != nil {
		msg = a.Err.Error()
	}
	return "[backend " + strconv.Itoa(a.Backend) + " " + a.Model + " try " + strconv.Itoa(a.Try) + "] " + msg
}

// LogValue returns the attempt as a slog group. It leaves out the model's
// raw output, which may hold user data, and gives only its length.
func (a Attempt) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, 11)
	attrs = append(attrs,
		slog.Int("backend", a.Backend),
		slog.String("model", a.Model),
		slog.Int("try", a.Try),
		slog.String("kind", a.Kind.String()),
	)
	if a.Status != 0 {
		attrs = append(attrs, slog.Int("status", a.Status))
	}
	if a.Err != nil {
		attrs = append(attrs, slog.String("error", a.Err.Error()))
	}
	if a.RawText != nil {
		attrs = append(attrs, slog.Int("raw_len", len(*a.RawText)))
	}
	attrs = append(attrs, slog.Duration("elapsed", a.Elapsed))
	if a.RetryIn != 0 {
		attrs = append(attrs, slog.Duration("retry_in", a.RetryIn))
	}
	if a.Delivered {
		attrs = append(attrs, slog.Bool("delivered", true))
	}
	return slog.GroupValue(attrs...)
}

// attemptJSON is the wire form of an Attempt.
type attemptJSON struct {
	Backend   int       `json:"backend"`
	Model     string    `json:"model"`
	Try       int       `json:"try"`
	Kind      Kind      `json:"kind"`
	Status    int       `json:"status"`
	Error     *string   `json:"error,omitempty"`
	RawText   *string   `json:"raw_text,omitempty"` // a pointer, so "" is kept and nil is left out
	Start     time.Time `json:"start"`
	ElapsedMS float64   `json:"elapsed_ms"`
	RetryInMS float64   `json:"retry_in_ms"`
	Delivered bool      `json:"delivered"`
}

// MarshalJSON encodes the attempt with snake_case keys: the error as its
// message, raw_text left out when RawText is nil and kept when it is "",
// durations as elapsed_ms and retry_in_ms, and the kind as its name.
func (a Attempt) MarshalJSON() ([]byte, error) {
	j := attemptJSON{
		Backend:   a.Backend,
		Model:     a.Model,
		Try:       a.Try,
		Kind:      a.Kind,
		Status:    a.Status,
		RawText:   a.RawText,
		Start:     a.Start,
		ElapsedMS: millis(a.Elapsed),
		RetryInMS: millis(a.RetryIn),
		Delivered: a.Delivered,
	}
	if a.Err != nil {
		msg := a.Err.Error()
		j.Error = &msg
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON wrote. The error comes back as a
// plain error with the same message: its type does not survive, but Kind,
// Status and RawText keep what the chain concluded from it.
func (a *Attempt) UnmarshalJSON(data []byte) error {
	var j attemptJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("llmretry: decoding attempt: %w", err)
	}
	elapsed, err := fromMillis("elapsed_ms", j.ElapsedMS)
	if err != nil {
		return err
	}
	retryIn, err := fromMillis("retry_in_ms", j.RetryInMS)
	if err != nil {
		return err
	}
	*a = Attempt{
		Backend:   j.Backend,
		Model:     j.Model,
		Try:       j.Try,
		Kind:      j.Kind,
		Status:    j.Status,
		RawText:   j.RawText,
		Start:     j.Start,
		Elapsed:   elapsed,
		RetryIn:   retryIn,
		Delivered: j.Delivered,
	}
	if j.Error != nil {
		a.Err = errors.New(*j.Error)
	}
	return nil
}

// millis converts d to milliseconds, keeping nanoseconds as the fraction.
func millis(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}

// fromMillis converts milliseconds back to a Duration, refusing values that
// a Duration cannot hold rather than wrapping around.
func fromMillis(key string, ms float64) (time.Duration, error) {
	ns := math.Round(ms * float64(time.Millisecond))
	if math.IsNaN(ns) || ns < 0 || ns >= math.MaxInt64 {
		return 0, fmt.Errorf("llmretry: decoding attempt: %s %v is out of range", key, ms)
	}
	return time.Duration(ns), nil
}
