package chaos

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Proxy forwards TCP connections to a target and can cut them all, delay
// their traffic, or stop forwarding without closing anything (a
// blackhole: a firewall or NAT table that drops packets, where no FIN or
// RST tells either end): the network between nodes and PostgreSQL.
type Proxy struct {
	ln net.Listener
	// Delay is added before each forwarded read, in nanoseconds.
	Delay atomic.Int64

	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	// held is closed when a blackhole ends; nil when traffic passes.
	held chan struct{}
	// gen counts blackholes; a connection accepted at gen g is forgotten
	// (its traffic dropped for good, as by a NAT table that lost it) when
	// g < forgotten. cutting is closed by Cut, which ends them.
	gen, forgotten int
	cutting        chan struct{}
	// servers are the connections to the target, with the gen they were
	// accepted at.
	servers map[net.Conn]int
}

// NewProxy starts a proxy to target on a free port of 127.0.0.1.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, servers: map[net.Conn]int{}, cutting: make(chan struct{})}
	go p.serve()
	return p, nil
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	// A connection made during a blackhole is accepted (by the kernel,
	// as a SYN that gets no answer would leave the client waiting) and
	// goes nowhere until it ends.
	p.track(client)
	p.mu.Lock()
	born := p.gen
	p.mu.Unlock()
	if !p.pass(born) {
		p.untrack(client)
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	server, err := net.Dial("tcp", target)
	if err != nil {
		p.untrack(client)
		client.Close()
		return
	}
	p.track(client, server)
	p.mu.Lock()
	p.servers[server] = born
	p.mu.Unlock()
	defer func() {
		p.untrack(client, server)
		p.mu.Lock()
		delete(p.servers, server)
		p.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if !p.pass(born) {
					break
				}
				if d := time.Duration(p.Delay.Load()); d > 0 {
					time.Sleep(d) // the fault being injected, not synchronization
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}

func (p *Proxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// pass waits while a blackhole lasts, and reports whether the traffic of
// a connection accepted at gen born may pass: false once Cut ended a
// forgotten one.
func (p *Proxy) pass(born int) bool {
	for {
		p.mu.Lock()
		held, dead, cutting := p.held, born < p.forgotten, p.cutting
		p.mu.Unlock()
		switch {
		case dead:
			<-cutting
			return false
		case held != nil:
			select {
			case <-held:
			case <-cutting:
			}
		default:
			return true
		}
	}
}

// Blackhole stops forwarding in both directions, on the open connections
// and on new ones, without closing any, until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
		p.gen++
	}
}

// Restore ends a blackhole. With forget, the connections opened before it
// stay silent for good, never closed (as when a NAT table forgot them:
// only keepalives, timeouts or checks of their own tell their ends);
// without, what was held back is forwarded, as TCP retransmits it when a
// path comes back. Connections made during the blackhole go through.
func (p *Proxy) Restore(forget bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
		if forget {
			p.forgotten = p.gen
		}
	}
}

// Vanish drops the proxy's end of the forgotten connections to the target
// without a word (no FIN, no RST: the socket is put in TCP repair mode
// before it is closed), as when the path's NAT state is lost: the target
// hears nothing more from them, and its packets to them are answered with
// a reset, as by a host that has no such connection. It needs
// CAP_NET_ADMIN; without, it returns the error.
func (p *Proxy) Vanish() error {
	p.mu.Lock()
	var gone []net.Conn
	for c, born := range p.servers {
		if born < p.forgotten {
			gone = append(gone, c)
		}
	}
	p.mu.Unlock()
	for _, c := range gone {
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 1)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("TCP_REPAIR: %w", serr)
		}
		_ = c.Close()
	}
	return nil
}

// Retarget sends the connections made from now on to target.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Cut closes every open connection.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	close(p.cutting)
	p.cutting = make(chan struct{})
}

// Close stops accepting connections and cuts the open ones.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Restore(false)
	p.Cut()
}
