package pgbreaker

import (
	"context"
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

	mu       sync.Mutex
	watchers map[string]chan struct{} // per key: closed at the key's next change; nil until someone watches
	up       bool                     // LISTEN is in effect: a change now cannot go unnoticed
	lost     int                      // connections lost (or never made) since the store began
	stop     context.CancelFunc
	done     chan struct{}
}

// newListener starts listening with a connection made from config.
func newListener(config *pgx.ConnConfig) *listener {
	ctx, stop := context.WithCancel(context.Background())
	l := &listener{config: config, watchers: make(map[string]chan struct{}), stop: stop, done: make(chan struct{})}
	go l.run(ctx)
	return l
}

// watch returns a channel that is closed at the next change of key's row
// by any process, or when the listener cannot tell (its connection was
// lost and is back, so a change may have gone unnoticed). Watchers of
// one key share one channel: a wake is a cue to read the row again.
func (l *listener) watch(key string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := l.watchers[key]
	if ch == nil {
		ch = make(chan struct{})
		l.watchers[key] = ch
	}
	return ch
}

// wake closes the channel of key: its row changed.
func (l *listener) wake(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch := l.watchers[key]; ch != nil {
		close(ch)
		delete(l.watchers, key)
	}
}

// wakeAll closes every watcher's channel: while the connection was down
// any row may have changed unheard.
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, ch := range l.watchers {
		close(ch)
		delete(l.watchers, key)
	}
}

// setUp records whether LISTEN is in effect, counting a loss.
func (l *listener) setUp(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.up && !up {
		l.lost++
	}
	l.up = up
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
		l.setUp(false)
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
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return false
	}
	l.setUp(true)
	// Anything may have changed before LISTEN took effect, or while an
	// earlier connection was down: every watcher reads its row again.
	l.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true
		}
		l.wake(n.Payload)
	}
}

// close stops listening and waits for the connection to be closed.
func (l *listener) close() {
	l.stop()
	<-l.done
	l.wakeAll()
}
