// Package tcpproxy forwards TCP connections and can stall or cut them, to
// test what a client does when its server hangs or goes away.
package tcpproxy

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from Addr to a target. Pause holds all bytes
// in both directions (a stalled process, a partitioned network) until
// Resume; SetDown(true) cuts every connection and refuses new ones;
// SetDelay slows what clients send (a server far away, or overloaded).
type Proxy struct {
	Addr   string
	target string
	l      net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	down   bool
	delay  time.Duration // before each chunk from a client
	conns  []net.Conn
}

// New listens on a free loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	return p, nil
}

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(s, c, true)
		go p.pipe(c, s, false)
	}
}

// pipe copies src to dst; fromClient: src is the client's side.
func (p *Proxy) pipe(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay := p.delay
			p.mu.Unlock()
			if fromClient && delay > 0 {
				time.Sleep(delay)
			}
			p.mu.Lock()
			for p.paused {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// Pause holds every byte until Resume.
func (p *Proxy) Pause() { p.mu.Lock(); p.paused = true; p.mu.Unlock() }

// Resume lets held bytes through.
func (p *Proxy) Resume() { p.mu.Lock(); p.paused = false; p.cond.Broadcast(); p.mu.Unlock() }

// SetDelay holds each chunk a client sends for d before it goes on: a
// request takes d longer (zero: none).
func (p *Proxy) SetDelay(d time.Duration) { p.mu.Lock(); p.delay = d; p.mu.Unlock() }

// SetDown cuts every connection and refuses new ones while down is true.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	conns := p.conns
	if down {
		p.conns = nil
	}
	p.mu.Unlock()
	if down {
		for _, c := range conns {
			c.Close()
		}
	}
}

// SetTarget sends new connections to target (a failover); connections
// already open stay with the old one until they are cut.
func (p *Proxy) SetTarget(target string) { p.mu.Lock(); p.target = target; p.mu.Unlock() }

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.Resume()
	p.l.Close()
	p.SetDown(true)
}
