package pgbreaker

import (
	"context"
	"sync"
	"sync/atomic"
)

// A Store makes the calls of all its keys that are due at one time in
// one statement of each kind: one query loads every key being loaded,
// one statement writes every key being written. A process with many
// backends then costs the database a few statements per round trip,
// whatever the number of keys. One statement a call does not scale: a
// thousand Breakers deciding at once through a pool of four connections
// waited for a connection past their bound in 5,939 of 10,846 calls,
// and calls cut short mid-statement cost the pool its connections
// (each one dropped and made again). A batch waits for nothing but the
// statement before it, so a call alone costs what one statement costs.

// call is one store call, waiting for its batch.
type call struct {
	ctx     context.Context
	key     string
	version int64  // the version a swap expects; the version a load read
	state   []byte // what a swap writes (its own copy); what a load read
	ok      bool   // the swap wrote
	err     error
	done    chan struct{} // closed once the batch is done
}

// batcher runs the calls handed to it in batches, one batch at a time:
// the calls that come while one runs make the next. It is safe for
// concurrent use.
type batcher struct {
	// run makes the calls of one batch, setting each call's answer.
	run func(ctx context.Context, calls []*call)
	// distinct makes each batch hold a key at most once: a write
	// statement cannot change a row twice. A call on a key the batch
	// holds already waits for the next.
	distinct bool

	mu      sync.Mutex
	pending []*call
	running bool // a goroutine runs batches
}

// do hands c to the next batch and waits for its answer, or for ctx to
// be done. A call whose context is done before its batch starts is left
// out of it; one whose context ends while its batch runs gets ctx's
// error, though the batch may yet make it.
func (q *batcher) do(ctx context.Context, c *call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.ctx, c.done = ctx, make(chan struct{})
	q.mu.Lock()
	q.pending = append(q.pending, c)
	if !q.running {
		q.running = true
		go q.loop()
	}
	q.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loop runs batches until no call is pending.
func (q *batcher) loop() {
	for {
		q.mu.Lock()
		batch := q.take()
		if len(batch) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		q.runBatch(batch)
	}
}

// take removes the next batch from the pending calls and returns it,
// dropping the calls whose callers are gone. q.mu is held.
func (q *batcher) take() []*call {
	var batch, rest []*call
	seen := make(map[string]bool)
	for _, c := range q.pending {
		switch {
		case c.ctx.Err() != nil:
			c.err = c.ctx.Err()
			close(c.done)
		case q.distinct && seen[c.key]:
			rest = append(rest, c)
		default:
			seen[c.key] = true
			batch = append(batch, c)
		}
	}
	q.pending = rest
	return batch
}

// runBatch runs one batch. Its statement is not bound by any one
// caller's context, as cutting a statement short costs its connection,
// and the other callers their answers; it is cancelled once every
// caller is gone, as then no one waits for it.
func (q *batcher) runBatch(batch []*call) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waiting atomic.Int64
	waiting.Store(int64(len(batch)))
	for _, c := range batch {
		stop := context.AfterFunc(c.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	q.run(ctx, batch)
	for _, c := range batch {
		close(c.done)
	}
}
