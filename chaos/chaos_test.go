package main

import (
	"os"
	"os/exec"
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
	cfg.jobs, cfg.over = 1000, 12*time.Second
	if !run(cfg, os.Stdout) {
		t.Fatal("chaos: FAIL (see the table)")
	}
}
