package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The short form of zclaimpg's fault test, in make test: 200 jobs over
// 5 s, a worker SIGKILLed every 500 ms, Redis restarted from an older RDB
// snapshot; 0 lost and 0 twice with Complete, duplicates in the control.
func TestPGChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about ten seconds")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("the fault test needs redis-server on PATH (apt-get install redis-server)")
	}
	cmd := exec.Command("go", "run", ".", "-jobs", "200", "-over", "5s", "-kill-every", "500ms", "-lease", "1s")
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		t.Log(l)
	}
	if err != nil {
		t.Fatalf("pgchaos: %v", err)
	}
}
