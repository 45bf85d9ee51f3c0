package redisproc

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func needRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not on PATH: install Redis 7 (Debian: apt-get install redis-server), or run make test, which finds one")
	}
}

// A server whose port another server took while it was down does not
// take that server for itself on Restart: it fails, saying so. Before,
// its readiness check answered from the other server, and two tests
// shared one server without knowing.
func TestRestartOnATakenPort(t *testing.T) {
	needRedis(t)
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	s.Kill()
	other := exec.Command("redis-server", "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	for deadline := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			t.Fatal("the other server did not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	err = s.Restart()
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("Restart on a port another server holds: %v, want errPortTaken", err)
	}
	t.Log(err)
	if s.cmd != nil {
		t.Fatal("the server counts as running")
	}
	// Once the port is free again, Restart works.
	other.Process.Kill()
	other.Wait()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
}

// Ports are handed out below the kernel's ephemeral range, with their
// cluster bus ports free too; one in use is skipped; a process hands out
// a port again only after going round the whole range.
func TestFreePort(t *testing.T) {
	if top := portLow + portSpan - 1 + busOff; top >= 32768 {
		t.Fatalf("bus ports up to %d reach the kernel's ephemeral range (from 32768)", top)
	}
	// Hold a port, and the bus port of the one after it; hand out from there.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	var start int
	for p := portLow; held == nil; p++ {
		a, err1 := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		b, err2 := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1+busOff))
		if err1 == nil && err2 == nil {
			start, held = p, []net.Listener{a, b}
		} else {
			for _, l := range []net.Listener{a, b} {
				if l != nil {
					l.Close()
				}
			}
		}
	}
	portMu.Lock()
	portNext = start
	portMu.Unlock()
	seen := map[int]bool{}
	for range 50 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < portLow || p >= portLow+portSpan || seen[p] {
			t.Fatalf("port %d: out of range or handed out twice", p)
		}
		if p == start || p == start+1 {
			t.Fatalf("port %d handed out, though it or its bus port is in use", p)
		}
		seen[p] = true
	}
}
