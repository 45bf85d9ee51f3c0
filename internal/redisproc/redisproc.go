// Package redisproc starts and stops redis-server processes for the tests,
// the benchmarks and the fault test: on a free loopback port, in a folder
// of their own, without persistence unless asked, killed with the process
// that started them.
package redisproc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/proc"
)

// Server is a redis-server process.
type Server struct {
	Addr string   // 127.0.0.1:Port
	Port int      // its port, kept across Restart
	Dir  string   // its folder, kept across Restart, removed by Close
	Args []string // arguments after the defaults (a later directive wins); Restart uses them as they are then

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start runs redis-server (from PATH) on a free port with args after the
// defaults (no RDB, no AOF, quiet logs), and waits until it answers.
func Start(args ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "zclaim-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, Args: args}
	if err := s.Restart(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
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

// Restart starts the server again on its port and folder (after Kill),
// with Args as they are now, and waits until it answers.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.Dir, "--loglevel", "warning"}, s.Args...)
	cmd := exec.Command("redis-server", args...)
	proc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			return fmt.Errorf("redis-server on %s did not answer: %w", s.Addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL): what it did not persist is gone.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// Close kills the server and removes its folder.
func (s *Server) Close() {
	s.Kill()
	os.RemoveAll(s.Dir)
}

// QuietAsynq is an asynq.Logger that drops everything: asynq servers in
// the tests and benchmarks log through it.
type QuietAsynq struct{}

func (QuietAsynq) Debug(...any) {}
func (QuietAsynq) Info(...any)  {}
func (QuietAsynq) Warn(...any)  {}
func (QuietAsynq) Error(...any) {}
func (QuietAsynq) Fatal(...any) {}
