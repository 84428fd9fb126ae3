package pgbreaker_test

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmretry/llmretry/contrib/pgbreaker"
)

// silencer is a TCP proxy to PostgreSQL that can make the connections it
// carries go silent, as a network partition does: bytes are read and
// dropped, and nothing is closed. Connections made after Silence pass.
type silencer struct {
	ln     net.Listener
	target string
	gen    atomic.Int64 // connections of an earlier generation are silent
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func newSilencer(t *testing.T, target string) *silencer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silencer{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *silencer) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		d, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, d)
		p.mu.Unlock()
		gen := p.gen.Load()
		p.wg.Go(func() { p.pipe(d, c, gen) })
		p.wg.Go(func() { p.pipe(c, d, gen) })
	}
}

// pipe copies from src to dst until either fails, dropping what it
// reads once its generation is silenced.
func (p *silencer) pipe(dst, src net.Conn, gen int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if p.gen.Load() != gen {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// Silence makes every connection made so far silent.
func (p *silencer) Silence() { p.gen.Add(1) }

func (p *silencer) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// A listening connection that goes silent, as in a network partition,
// is found out by its keepalive ping: the store connects again, wakes
// its watchers, and hears the next write.
func TestWatchSilentConnection(t *testing.T) {
	t.Parallel()
	direct := freshSchema(t, pgURL(t), "pgbreaker_silent")
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newSilencer(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	writer, _ := newStore(t, direct)
	watcher := pgbreaker.NewKeepalive(newPool(t, u.String()), 100*time.Millisecond, 200*time.Millisecond)
	defer watcher.Close()
	ctx, key := t.Context(), testKey(t)

	ch, err := watcher.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch() = %v", err)
	}
	if err := pgbreaker.Listening(ctx, watcher); err != nil {
		t.Fatalf("Listening() = %v", err)
	}
	select {
	case <-ch:
	default:
	}
	proxy.Silence()
	recv(t, ch, "reconnect after the connection went silent")
	if ok, err := writer.CompareAndSwap(ctx, key, 0, []byte("1")); !ok || err != nil {
		t.Fatalf("CompareAndSwap() = %v, %v; want true, nil", ok, err)
	}
	recv(t, ch, "a write after the reconnect")
}
