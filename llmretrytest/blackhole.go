package llmretrytest

import (
	"net"
	"sync"
)

// Blackhole is a host that accepts TCP connections on 127.0.0.1 and then
// neither reads from them nor writes to them, as a wedged provider or a
// broken proxy in front of one does. A client's request waits for a
// response that never comes; one with a body larger than the connection's
// buffers (a few MiB on loopback) blocks in its write. Until
// [Blackhole.Close], which closes every connection, only the client's own
// deadline ends the wait. Create one with [NewBlackhole] and end it with
// Close; the zero Blackhole is not usable. Its methods are safe for
// concurrent use.
type Blackhole struct {
	// URL is the base URL, "http://127.0.0.1:PORT", with no trailing
	// slash. Any path under it is a black hole.
	URL string

	ln       net.Listener
	accepted chan struct{} // closed when the accept loop has returned
	once     sync.Once

	mu    sync.Mutex
	conns []net.Conn
	n     int
}

// NewBlackhole starts a Blackhole listening on a free port of 127.0.0.1.
// It panics if it cannot listen, as [NewServer] does.
func NewBlackhole() *Blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic("llmretrytest: failed to listen on a port: " + err.Error())
	}
	b := &Blackhole{URL: "http://" + ln.Addr().String(), ln: ln, accepted: make(chan struct{})}
	go b.accept()
	return b
}

// accept takes connections until the listener is closed and keeps them,
// unread, for Close.
func (b *Blackhole) accept() {
	defer close(b.accepted)
	for {
		c, err := b.ln.Accept()
		if err != nil {
			// Closed by Close, or out of file descriptors: either way a
			// connection that is not accepted waits in the kernel's
			// backlog, which is as black a hole.
			return
		}
		b.mu.Lock()
		b.conns = append(b.conns, c)
		b.n++
		b.mu.Unlock()
	}
}

// Accepted returns how many connections the Blackhole has accepted so
// far. A connection whose client has given up stays open on the
// Blackhole's side until Close, since it never reads to notice.
func (b *Blackhole) Accepted() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// Close stops listening and closes every connection it accepted; it
// returns once its goroutine is done, so a test that closes its Blackhole
// leaks nothing. Later connections are refused. Close may be called more
// than once; Accepted still works after it.
func (b *Blackhole) Close() {
	b.once.Do(func() {
		_ = b.ln.Close()
		<-b.accepted // no connection is added after this
		b.mu.Lock()
		conns := b.conns
		b.conns = nil
		b.mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
}
