package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// TestMain lets this test binary play the child roles too.
func TestMain(m *testing.M) {
	if runRole() {
		return
	}
	os.Exit(m.Run())
}

// The short form of the fault test: a couple of minutes, in CI.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for a couple of minutes")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("the fault test needs redis-server on PATH (apt-get install redis-server)")
	}
	cfg := defaultConfig()
	cfg.jobs, cfg.over = 700, 8*time.Second
	// Every line of the run is progress: make test shows it as it comes.
	if !run(cfg, &progress{w: os.Stdout}) {
		t.Fatal("chaos: FAIL (see the table)")
	}
}

// progress marks each line written through it for make test's output.
// The run writes from more than one goroutine.
type progress struct {
	w    io.Writer
	mu   sync.Mutex
	line []byte
}

func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line = append(p.line, b...)
	for {
		i := bytes.IndexByte(p.line, '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := fmt.Fprintf(p.w, "progress: %s\n", p.line[:i]); err != nil {
			return 0, err
		}
		p.line = p.line[i+1:]
	}
}
