// Package pgproc finds a PostgreSQL server for the tests, the benchmarks
// and the fault test: the one named by ZCLAIM_TEST_POSTGRES (a URL), else
// one answering on 127.0.0.1:5432 (user postgres, database test), else one
// it starts itself from initdb and postgres on PATH (or in Debian's
// /usr/lib/postgresql/*/bin), in a folder of its own, as an unprivileged
// user when it runs as root (PostgreSQL refuses to run as root). Callers
// create only schemas of their own on it and drop them.
package pgproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/zclaim/zclaim/internal/proc"
)

// Env names a server to use instead of looking for one.
const Env = "ZCLAIM_TEST_POSTGRES"

// Install says in one line what to install when no server can be had.
const Install = "zclaimpg's tests need PostgreSQL 15 or later: set " + Env + "=postgres://..., " +
	"run one on 127.0.0.1:5432 (user postgres, database test), or install one (apt-get install postgresql)"

// Server is a PostgreSQL server for the tests.
type Server struct {
	URL  string // connection URL, for pgx and database/sql
	From string // where it came from: "env", "local" or the folder of the one started
	cmd  *exec.Cmd
	dir  string
}

// Find returns a server as the package doc says. Close stops a server it
// started and does nothing to any other.
func Find() (*Server, error) {
	if u := os.Getenv(Env); u != "" {
		return &Server{URL: u, From: "env"}, nil
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:5432", time.Second); err == nil {
		c.Close()
		return &Server{URL: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", From: "local"}, nil
	}
	return start()
}

// binDir finds the folder that holds initdb and postgres.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no initdb and postgres on PATH or in /usr/lib/postgresql/*/bin")
}

func start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "zclaim-pg-")
	if err != nil {
		return nil, err
	}
	var uid, gid int = -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, errors.New("running as root and no user postgres or nobody to run PostgreSQL as")
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		os.Chmod(dir, 0o755)
	}
	data := filepath.Join(dir, "data")
	as := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		proc.DieWithParent(cmd)
		if uid >= 0 {
			proc.RunAs(cmd, uid, gid)
		}
		return cmd
	}
	if uid >= 0 {
		os.Mkdir(data, 0o700)
		os.Chown(data, uid, gid)
	}
	if out, err := as("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, strings.TrimSpace(string(out)))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := as("postgres", "-D", data, "-p", strconv.Itoa(port), "-h", "127.0.0.1", "-k", dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), From: dir, cmd: cmd, dir: dir}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
			c.Close()
			// The port opens before the server accepts logins; callers
			// retry their first connection (see Wait).
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, errors.New("the PostgreSQL server started from " + bin + " did not answer within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops a server that Find started, and removes its folder.
func (s *Server) Close() {
	if s.cmd != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		os.RemoveAll(s.dir)
	}
}

// SchemaName returns a schema name of its own for name (a test's), safe to
// put in SQL unquoted: lower-case letters, digits and underscores.
func SchemaName(name string) string {
	var b strings.Builder
	b.WriteString("zt_")
	for _, r := range strings.ToLower(name) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	return s + "_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
}
