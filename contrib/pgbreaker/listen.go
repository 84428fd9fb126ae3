package pgbreaker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	keys      map[string]noticed                // the keys this process uses, and what their newest notice said
	table     uint32                            // the oid of the table the statements reach; 0: not known, and no state is kept
	closed    bool                              // close has run: no more watchers
	heard     chan struct{}                     // closed once LISTEN first took effect (for tests)
	heardOnce sync.Once
	stop      context.CancelFunc
	done      chan struct{}
}

// newListener starts listening with a connection made from config.
func newListener(config *pgx.ConnConfig, keepalive, pingTimeout time.Duration) *listener {
	ctx, stop := context.WithCancel(context.Background())
	l := &listener{config: config, keepalive: keepalive, pingTimeout: pingTimeout, watchers: make(map[string]map[chan struct{}]bool),
		keys: make(map[string]noticed), stop: stop, done: make(chan struct{}), heard: make(chan struct{})}
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

// noticed is what the newest notice of a key said: the row's version
// and, when carried, its state. The zero value knows nothing.
type noticed struct {
	version int64
	state   []byte
	carried bool
	told    bool // a write's notice on stateChannel came, and its notice on channel is still to come
}

// use records that this process uses key: the notices of its changes
// are kept from now on, for noticedOf. A process keeps nothing of the
// keys it does not use.
func (l *listener) use(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.keys[key]; !ok {
		l.keys[key] = noticed{}
	}
}

// noticedOf returns the state of key that its newest notice carried,
// and its version; ok is false when no notice of it came since the
// connection last began to listen and key was first used, or the newest
// carried no state.
func (l *listener) noticedOf(key string) (state []byte, version int64, ok bool) {
	l.use(key)
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.keys[key]
	return n.state, n.version, n.carried
}

// hear takes in a notice on ch, the channel it came on, and wakes the
// watchers of its key. A write of this package notifies stateChannel and
// then channel, in one transaction, whose notices come together: the
// first keeps the state (before the watchers wake, as a watcher that
// wakes reads it) and wakes them, and the second is then passed over. A
// notice on channel alone (a write of an earlier version of this
// package, or of another schema's table, whose notice on stateChannel is
// not kept) says only that the key changed: what was kept is then stale.
// A payload on stateChannel that cannot be read is not this package's
// (any client may NOTIFY): the write it stands for, if any, notified
// channel too.
func (l *listener) hear(ch, payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := payload
	k, used := l.keys[key]
	if ch == channel {
		if used {
			told := k.told
			k.carried, k.told = k.carried && told, false
			l.keys[key] = k
			if told {
				return
			}
		}
	} else {
		n, ok := parseNotice(payload)
		if !ok || n.table != l.table {
			return
		}
		key = n.key
		k, used = l.keys[key]
		if !used {
			return
		}
		if n.version > k.version {
			k = noticed{version: n.version, state: n.state, carried: n.carried}
		}
		k.told = true
		l.keys[key] = k
	}
	for w := range l.watchers[key] {
		notify(w)
	}
}

// forget drops what the notices said of every key used: a notice may
// have gone unheard since.
func (l *listener) forget() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key := range l.keys {
		l.keys[key] = noticed{}
	}
}

// wakeAll tells every watcher that its row may have changed, and
// forgets every notice kept: while the connection was down any row may
// have changed unheard.
func (l *listener) wakeAll() {
	l.forget()
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
	// The notices to keep are those of the table the statements reach,
	// the connection having the pool's search_path. When the server
	// cannot say (before Migrate made it, a statement timeout), none: a
	// Breaker then loads. (Read before LISTEN, which stays the
	// connection's last statement for pg_stat_activity to show.)
	var table uint32
	tableCtx, cancel := context.WithTimeout(ctx, l.pingTimeout)
	err = conn.QueryRow(tableCtx, tableSQL).Scan(&table)
	cancel()
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) {
		return false // the connection failed: try again
	}
	l.mu.Lock()
	l.table = table
	l.mu.Unlock()
	listenCtx, cancel := context.WithTimeout(ctx, l.pingTimeout)
	_, err = conn.Exec(listenCtx, "LISTEN "+channel+"; LISTEN "+stateChannel)
	cancel()
	if err != nil {
		return false
	}
	// What was kept of the rows' notices is no longer known to be the
	// newest once the connection ends.
	defer l.forget()
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
			l.hear(n.Channel, n.Payload)
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
