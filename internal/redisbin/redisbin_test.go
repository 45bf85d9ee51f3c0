package redisbin

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The three ways a lookup can end: found on PATH, obtained into the cache
// (then found there), and impossible, with the line that says what to install.
func TestFind(t *testing.T) {
	t.Run("found", func(t *testing.T) {
		bin, err := exec.LookPath("redis-server")
		if err != nil {
			t.Skip("no redis-server on PATH (make test puts the one it found first)")
		}
		res, err := Find(Options{Path: filepath.Dir(bin)})
		if err != nil || res.Source != "PATH" || !strings.HasPrefix(res.Version, "7.") && !strings.HasPrefix(res.Version, "8.") {
			t.Fatalf("Find: %+v, %v", res, err)
		}
	})
	t.Run("obtained", func(t *testing.T) {
		if _, err := tool("apt-get"); err != nil {
			t.Skip("no apt-get on this machine")
		}
		t.Parallel()
		cache := t.TempDir()
		res, err := Find(Options{Path: t.TempDir(), Cache: cache, AptGet: "apt-get", Log: t.Logf})
		if err != nil || res.Source != "downloaded" {
			t.Fatalf("Find with nothing on PATH: %+v, %v", res, err)
		}
		out, err := exec.Command(res.Bin, "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "v="+res.Version) {
			t.Fatalf("the obtained server: %s %v", out, err)
		}
		again, err := Find(Options{Cache: cache, AptGet: "apt-get"})
		if err != nil || again.Source != "cache" || again.Bin != res.Bin {
			t.Fatalf("Find again: %+v, %v", again, err)
		}
	})
	// Valkey from Debian 13, on that release's C library: the server
	// answers its own CLI, both through the wrappers the tests start.
	t.Run("dist", func(t *testing.T) {
		if _, err := tool("apt-get"); err != nil {
			t.Skip("no apt-get on this machine")
		}
		t.Parallel()
		cache := t.TempDir()
		// A redis-server on Path, which a Dist passes over.
		res, err := Find(Options{Path: filepath.Dir(mustLook(t, "redis-server")), Cache: cache, AptGet: "apt-get", Dist: "trixie", Server: "valkey", Log: t.Logf})
		if err != nil || res.Source != "downloaded" || !strings.HasPrefix(res.Version, "8.") {
			t.Fatalf("Find of trixie's valkey: %+v, %v", res, err)
		}
		if out, err := exec.Command(res.Bin, "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "Valkey server v="+res.Version) {
			t.Fatalf("the obtained server: %s %v", out, err)
		}
		port := freePort(t)
		srv := exec.Command(res.Bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", t.TempDir())
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
		cli := filepath.Join(filepath.Dir(res.Bin), "redis-cli")
		var out []byte
		for try := 0; try < 100; try++ {
			if out, err = exec.Command(cli, "-p", port, "INFO", "server").CombinedOutput(); err == nil && strings.Contains(string(out), "valkey_version:"+res.Version) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(string(out), "valkey_version:"+res.Version) {
			t.Fatalf("INFO server through the obtained redis-cli: %s %v", out, err)
		}
	})
	t.Run("impossible", func(t *testing.T) {
		// An old server on PATH is passed over, and saying so is part of the error.
		dir := t.TempDir()
		old := "#!/bin/sh\necho 'Redis server v=6.2.7 sha=00000000:0 malloc=libc bits=64'\n"
		if err := os.WriteFile(filepath.Join(dir, "redis-server"), []byte(old), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := Find(Options{Path: dir, Cache: t.TempDir(), AptGet: ""})
		if !errors.Is(err, ErrNone) || !strings.Contains(err.Error(), "apt-get install redis-server") || !strings.Contains(err.Error(), "6.2.7") {
			t.Fatalf("Find with only Redis 6: %v", err)
		}
		_, err = Find(Options{Path: t.TempDir(), Cache: t.TempDir(), AptGet: filepath.Join(t.TempDir(), "apt-get")})
		if !errors.Is(err, ErrNone) {
			t.Fatalf("Find without apt-get: %v", err)
		}
	})
}

// mustLook finds a command on PATH.
func mustLook(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
