package llmretry

import (
	"context"
	"errors"
	"iter"
	"sync"
)

// This file holds a call's stream: the consumer a caller gives one call
// (WithStream, Chain.Stream), and Emit, by which a backend hands it the
// answer as it arrives.

// Chunk is a piece of a streamed answer, as a call's stream receives it
// from [WithStream] or [Chain.Stream].
type Chunk struct {
	// Text is the answer's next piece: it follows the Text of the
	// chunks before it. It is empty only in a Restart chunk.
	Text string
	// Restart says that the answer starts again ([Chain.Restart]):
	// discard the text of every chunk before this one; the chunks after
	// it are a whole new answer.
	Restart bool
}

// streamKey finds a call's stream in a context.
type streamKey struct{}

// sink is a call's stream as WithStream set it.
type sink struct {
	mu sync.Mutex // one chunk at a time, whatever goroutine emits it
	f  func(Chunk)
}

// send hands c to the stream's consumer.
func (s *sink) send(c Chunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f(c)
}

// WithStream returns a copy of ctx under which [Chain.Do] streams its
// answer to f: every piece of text a backend hands over with [Emit]
// reaches f as a [Chunk], in order, one call at a time, before the
// backend reads on. A streaming backend sees that the call streams
// ([Streaming]) and hands its text over as it arrives, where it would
// otherwise hold the answer and return it whole; the adapters under
// contrib/ do. So each call can stream to its own consumer, an HTTP
// response or a channel, without a writer in the request.
//
// The rules of [Delivered] hold: once a chunk has reached f, a failure
// of that attempt is not sent again as it was. The time f takes is not
// counted against the attempt's [Backend.StallTimeout]: the backend
// reads nothing meanwhile. f must not call Do under ctx. A nil f leaves
// ctx as it is, so a call under it does not stream. The stream belongs to
// the call Do makes under the returned context and to chains nested in
// its attempts; [Standalone] hides it from a chain of its own.
func WithStream(ctx context.Context, f func(Chunk)) context.Context {
	if ctx == nil || f == nil {
		return ctx
	}
	return context.WithValue(ctx, streamKey{}, &sink{f: f})
}

// sinkOf is the stream of the call Do makes under ctx, nil when it does
// not stream.
func sinkOf(ctx context.Context) *sink {
	s, _ := ctx.Value(streamKey{}).(*sink)
	return s
}

// Emit hands text, the answer's next piece, to the caller of the call
// whose attempt runs under ctx: to the call's stream when it has one
// ([WithStream], [Chain.Stream]), and it marks the attempt as
// [Delivered] does, before text reaches anyone. A streaming backend calls
// it with every piece of text it hands over, whether it also hands the
// text to a consumer of its own or not, so that the chain knows what the
// caller holds.
//
// Emit does nothing with empty text, with a context that is not an
// attempt's, or once the attempt's Call has returned: a goroutine the
// backend left behind cannot write into the caller's stream. It is safe
// to call from any goroutine; the pieces reach the stream in the order of
// the calls.
func Emit(ctx context.Context, text string) {
	if ctx == nil || text == "" {
		return
	}
	if a, _ := ctx.Value(markKey{}).(*attemptCtx); a != nil {
		a.emit(text)
	}
}

// Streaming reports whether the call that the attempt under ctx belongs
// to streams its answer ([WithStream], [Chain.Stream]). A backend that
// can stream hands its text to [Emit] as it arrives when it does, and may
// hold the answer and return it whole when it does not; a backend that
// cannot stream may hand its whole answer to Emit as it returns it, so
// that the stream has the text too.
func Streaming(ctx context.Context) bool {
	if ctx == nil {
		return false
	}
	a, _ := ctx.Value(markKey{}).(*attemptCtx)
	return a != nil && a.sink != nil
}

// errStopped is the cause of a streamed call's context when the loop over
// [Chain.Stream] stopped early.
var errStopped = errors.New("llmretry: the loop over the stream stopped")

// Stream sends req through the chain as [Chain.Do] does and yields the
// answer's chunks as the backends hand them over, each with a nil error,
// as [WithStream] would hand them to a function:
//
//	for chunk, err := range chain.Stream(ctx, req) {
//		if err != nil {
//			return err // what Do returned
//		}
//		fmt.Print(chunk.Text)
//	}
//
// When the call fails, the last pair is a zero Chunk and the error Do
// returned; a call that succeeds ends after its last chunk, and a
// backend that hands over nothing (one that cannot stream) yields no
// chunk at all: use WithStream and Do for the answer itself. Breaking out
// of the loop cancels the call; nothing is yielded after that. The loop's
// body runs while the backend waits for it, as f does for WithStream.
func (c *Chain[Req, Resp]) Stream(ctx context.Context, req Req) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		if ctx == nil {
			yield(Chunk{}, &configError{"llmretry: context is nil"})
			return
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		var (
			mu   sync.Mutex
			done bool // the loop stopped, or Do returned: yield no more
		)
		_, err := c.Do(WithStream(ctx, func(ch Chunk) {
			mu.Lock()
			defer mu.Unlock()
			if !done && !yield(ch, nil) {
				done = true
				cancel(errStopped)
			}
		}), req)
		mu.Lock()
		stopped := done
		done = true
		mu.Unlock()
		if err != nil && !stopped {
			yield(Chunk{}, err)
		}
	}
}
