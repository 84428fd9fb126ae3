package pgbreaker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// channel is the NOTIFY channel every store of every process uses; the
// payload is the backend key whose row changed. One channel for all
// keys keeps to one LISTEN per process, whatever the number of keys.
const channel = "llmretry_breaker"

// listener holds the one listening connection of a [Store] and fans its
// notifications out to the watchers of each key. It is safe for
// concurrent use.
type listener struct {
	config *pgx.ConnConfig // a copy of the pool's, for a connection of its own

	// keepalive is how long the listening connection may be silent
	// before it is pinged, and pingTimeout how long the ping may take
	// before the connection counts as lost.
	keepalive, pingTimeout time.Duration

	mu        sync.Mutex
	watchers  map[string]map[chan struct{}]bool // per key, the channels of its watchers
	closed    bool                              // close has run: no more watchers
	heard     chan struct{}                     // closed once LISTEN first took effect (for tests)
	heardOnce sync.Once
	stop      context.CancelFunc
	done      chan struct{}
}

// newListener starts listening with a connection made from config.
func newListener(config *pgx.ConnConfig, keepalive, pingTimeout time.Duration) *listener {
	ctx, stop := context.WithCancel(context.Background())
	l := &listener{config: config, keepalive: keepalive, pingTimeout: pingTimeout, watchers: make(map[string]map[chan struct{}]bool), stop: stop, done: make(chan struct{}), heard: make(chan struct{})}
	go l.run(ctx)
	return l
}

// watch returns a channel that receives a value at each change of key's
// row by any process, and when the listener cannot tell (its connection
// was lost and is back, so a change may have gone unheard), until ctx is
// done or the listener is closed; then the channel is closed. A value
// waiting unread stands for every change since: the channel holds one.
// It reports false when the listener is closed.
func (l *listener) watch(ctx context.Context, key string) (<-chan struct{}, bool) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, false
	}
	set := l.watchers[key]
	if set == nil {
		set = make(map[chan struct{}]bool)
		l.watchers[key] = set
	}
	set[ch] = true
	context.AfterFunc(ctx, func() { l.unwatch(key, ch) })
	return ch, true
}

// unwatch closes ch and forgets it, unless close did already.
func (l *listener) unwatch(key string, ch chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if set := l.watchers[key]; set[ch] {
		delete(set, ch)
		if len(set) == 0 {
			delete(l.watchers, key)
		}
		close(ch)
	}
}

// notify tells ch of a change, unless it has one to tell already.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wake tells the watchers of key that its row changed.
func (l *listener) wake(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.watchers[key] {
		notify(ch)
	}
}

// wakeAll tells every watcher that its row may have changed: while the
// connection was down any row may have changed unheard.
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, set := range l.watchers {
		for ch := range set {
			notify(ch)
		}
	}
}

// reconnect bounds the pause between attempts to get the listening
// connection back: short, as a waiting call relies on it to wake, but
// not a storm against a server that is down.
const (
	reconnectMin = 50 * time.Millisecond
	reconnectMax = 2 * time.Second
)

// run keeps a listening connection until ctx is done, reconnecting after
// a loss with a doubling pause.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	pause := reconnectMin
	for {
		listened := l.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			pause = reconnectMin // it was working: try again soon
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, reconnectMax)
	}
}

// listenOnce connects, listens and hands out notifications until the
// connection fails or ctx is done. It reports whether LISTEN took effect.
func (l *listener) listenOnce(ctx context.Context) bool {
	connectCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := pgx.ConnectConfig(connectCtx, l.config)
	cancel()
	if err != nil {
		return false
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	listenCtx, cancel := context.WithTimeout(ctx, l.pingTimeout)
	_, err = conn.Exec(listenCtx, "LISTEN "+channel)
	cancel()
	if err != nil {
		return false
	}
	// Anything may have changed before LISTEN took effect, or while an
	// earlier connection was down: every watcher reads its row again.
	l.wakeAll()
	l.heardOnce.Do(func() { close(l.heard) })
	for {
		// A connection can die without a word (a partition, a host that
		// vanished): waiting for a notice alone would wait for good,
		// and no watcher would wake again. So the wait is cut at each
		// keepalive, and a ping that fails in time ends the connection.
		// A timed-out wait leaves the connection usable: pgx closes it
		// only on errors other than timeouts.
		waitCtx, cancel := context.WithTimeout(ctx, l.keepalive)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			l.wake(n.Payload)
			continue
		case ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded):
			return true
		}
		pingCtx, cancel := context.WithTimeout(ctx, l.pingTimeout)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return true
		}
	}
}

// The listening connection's keepalive and ping timeout: a silent
// connection is found out within their sum. A ping every half minute
// costs the server nothing.
const (
	keepalive   = 30 * time.Second
	pingTimeout = 5 * time.Second
)

// close stops listening, waits for the connection to be closed, and
// closes every watcher's channel.
func (l *listener) close() {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for key, set := range l.watchers {
		for ch := range set {
			close(ch)
		}
		delete(l.watchers, key)
	}
}
