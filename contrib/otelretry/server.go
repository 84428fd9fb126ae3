package otelretry

import (
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
)

// server is where an attempt's request went, as net/http tells it through
// the context's httptrace hooks: any Call that passes its context to its
// HTTP requests, as the adapters and the SDKs do, reports it without
// knowing of this package. The Host the request was written with names
// the server behind any proxy, which is what the conventions ask for; the
// address the transport asked a connection of is the proxy's when there
// is one, so it only fills the port in, and stands in for a request that
// failed before it was written (a refused connection). Its hooks run on
// the transport's goroutines, hence the lock.
type server struct {
	mu     sync.Mutex
	host   string // the Host header (":authority" in HTTP/2) last written
	dialed string // the host:port a connection was last asked for
	tls    bool   // the last connection got was TLS
}

// trace returns the hooks that fill s in.
func (s *server) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GetConn: func(hostPort string) {
			s.mu.Lock()
			s.dialed = hostPort
			s.mu.Unlock()
		},
		GotConn: func(info httptrace.GotConnInfo) {
			_, ok := info.Conn.(*tls.Conn)
			s.mu.Lock()
			s.tls = ok
			s.mu.Unlock()
		},
		WroteHeaderField: func(key string, value []string) {
			if (key == "Host" || key == ":authority") && len(value) > 0 {
				s.mu.Lock()
				s.host = value[0]
				s.mu.Unlock()
			}
		},
	}
}

// addr returns the server's address and port: "" and 0 when no request
// was made.
func (s *server) addr() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dialHost, dialPort := splitHostPort(s.dialed)
	if s.host == "" {
		return dialHost, dialPort
	}
	host, port := splitHostPort(s.host)
	switch {
	case port != 0:
	case host == dialHost:
		port = dialPort
	case s.tls:
		// Through a proxy, to the scheme's default port.
		port = 443
	default:
		port = 80
	}
	return host, port
}

// splitHostPort splits "host:port", "host", "[::1]:443" or "[::1]" into
// the host, without brackets, and the port, 0 when there is none.
func splitHostPort(hostPort string) (string, int) {
	if host, port, err := net.SplitHostPort(hostPort); err == nil {
		n, _ := strconv.Atoi(port)
		return host, n
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostPort, "["), "]"), 0
}
