// Package redisproc starts and stops redis-server processes for the tests,
// the benchmarks and the fault test: on a free loopback port from 10000
// to 19999 (below the kernel's ephemeral ports), in a folder of their own,
// without persistence unless asked, killed with the process that started
// them. A server that answers on a port is taken for one of ours only
// when its process id is our child's.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/proc"
	"github.com/zclaim/zclaim/internal/redisinfo"
)

// Server is a redis-server process.
type Server struct {
	Addr string   // 127.0.0.1:Port
	Port int      // its port, kept across Restart
	Dir  string   // its folder, kept across Restart, removed by Close
	Args []string // arguments after the defaults (a later directive wins); Restart uses them as they are then

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Start runs redis-server (from PATH) on a free port with args after the
// defaults (no RDB, no AOF, quiet logs), and waits until it answers.
func Start(args ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH")
	}
	dir, err := os.MkdirTemp("", "zclaim-redis-")
	if err != nil {
		return nil, err
	}
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, Args: args}
		err = s.Restart()
		if err == nil {
			return s, nil
		}
		// Another process took the port between the check and the start:
		// the next one.
		if !errors.Is(err, errPortTaken) || try == 5 {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// The servers' ports are handed out from portLow up to portLow +
// portSpan - 1, below the kernel's ephemeral range (32768–60999 by
// default), from which listeners on port 0 and clients' connections take
// theirs: a port that a killed server will take again on Restart is not
// handed to anyone else meanwhile, by this process or by the kernel. Each
// server's cluster bus port (its port + 10000) lies above them, below the
// ephemeral range too. A process starts at a random place and goes round;
// a port that another process holds is skipped.
const (
	portLow  = 10000
	portSpan = 10000
	busOff   = 10000
)

var (
	portMu   sync.Mutex
	portNext = portLow + rand.IntN(portSpan)
)

// freePort returns the next port from which neither it nor its bus port
// is in use.
func freePort() (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for range portSpan {
		p := portNext
		portNext = portLow + (portNext-portLow+1)%portSpan
		if free(p) && free(p+busOff) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port from %d to %d", portLow, portLow+portSpan-1)
}

func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// StartReplica starts a server that replicates primary (host:port) and
// waits until its link is up.
func StartReplica(primary string, args ...string) (*Server, error) {
	host, port, _ := net.SplitHostPort(primary)
	s, err := Start(append([]string{"--replicaof", host, port}, args...)...)
	if err != nil {
		return nil, err
	}
	if err := WaitLink(s.Addr, 10*time.Second); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// WaitLink waits until the replica at addr is linked to its primary.
func WaitLink(addr string, d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		info, _ := c.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica on %s did not link up within %v", addr, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// errPortTaken: another process holds a server's port.
var errPortTaken = errors.New("port taken")

// Restart starts the server again on its port and folder (after Kill),
// with Args as they are now, and waits until it answers. A server of
// another process that answers on the port is not taken for this one
// (its process id tells them apart): Restart fails with errPortTaken, as
// it does when this one cannot bind the port.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.Dir, "--loglevel", "warning"}, s.Args...)
	cmd := exec.Command("redis-server", args...)
	// Its output goes to a file, not a pipe: a pipe would hold Wait
	// until every process that inherited it (a fork saving a snapshot)
	// has ended.
	outName := filepath.Join(s.Dir, "redis-server.out")
	out, err := os.Create(outName)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	proc.DieWithParent(cmd)
	err = cmd.Start()
	out.Close()
	if err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() { cmd.Process.Kill(); <-exited }
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			said := lastBytes(outName, 2048)
			err := fmt.Errorf("redis-server on %s exited at its start: %s", s.Addr, said)
			if strings.Contains(said, "already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			if pid := redisinfo.Field(info, "process_id"); pid != strconv.Itoa(cmd.Process.Pid) {
				stop()
				return fmt.Errorf("%w: %s answers as another redis-server's (process %s, not %d)",
					errPortTaken, s.Addr, pid, cmd.Process.Pid)
			}
			s.cmd, s.exited = cmd, exited
			return nil
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("redis-server on %s did not answer: %w", s.Addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lastBytes returns the last n bytes of file name, trimmed.
func lastBytes(name string, n int) string {
	b, _ := os.ReadFile(name)
	return strings.TrimSpace(string(b[max(0, len(b)-n):]))
}

// Kill stops the server at once (SIGKILL): what it did not persist is gone.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Kill()
		<-s.exited
		s.cmd, s.exited = nil, nil
	}
}

// Close kills the server and removes its folder.
func (s *Server) Close() {
	s.Kill()
	os.RemoveAll(s.Dir)
}

// QuietRedis is a go-redis logger (redis.SetLogger) that drops
// everything: the pool's dial errors of the tests that stop Redis on
// purpose, and of the benchmarks; a call still returns its error.
type QuietRedis struct{}

func (QuietRedis) Printf(context.Context, string, ...any) {}

// QuietAsynq is an asynq.Logger that drops everything: asynq servers in
// the tests and benchmarks log through it.
type QuietAsynq struct{}

func (QuietAsynq) Debug(...any) {}
func (QuietAsynq) Info(...any)  {}
func (QuietAsynq) Warn(...any)  {}
func (QuietAsynq) Error(...any) {}
func (QuietAsynq) Fatal(...any) {}
