package llmretry

import "context"

// progressKey finds the innermost progress hook in a context.
type progressKey struct{}

// OnProgress returns a context derived from ctx under which f is called
// whenever an attempt of a chain run under it reports output or progress:
// every [Delivered] or [Progress] call whose context is an attempt's
// within that chain, after the call has marked the attempt. It is for code
// around a chain that must know a stream is alive, such as a job queue's
// or a workflow engine's heartbeat; nothing in the chain depends on it.
//
// f runs on the goroutine that called Delivered or Progress, which may be
// a backend's own, once per call: keep it short, and make it safe for
// concurrent use. Under a context that already has a hook, both are
// called, the earlier one first. A call of Delivered or Progress with a
// context that is not an attempt's calls neither, as it does nothing
// else. A nil f returns ctx unchanged; a nil ctx returns nil, which Do
// then reports as it would any nil context.
func OnProgress(ctx context.Context, f func()) context.Context {
	if ctx == nil || f == nil {
		return ctx
	}
	if prev, ok := ctx.Value(progressKey{}).(func()); ok {
		g := f
		f = func() { prev(); g() }
	}
	return context.WithValue(ctx, progressKey{}, f)
}

// progressed calls the progress hook of ctx, if it has one.
func progressed(ctx context.Context) {
	if f, ok := ctx.Value(progressKey{}).(func()); ok {
		f()
	}
}
