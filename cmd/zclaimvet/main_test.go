package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// go vet -vettool with the built analyzer: over the root module and the
// example's it reports the example's -naive poller (racy), and the
// benchmark's and the migration example's checked pollers (milder), and
// nothing else: nothing in zclaim itself; over asynq's and go-redis'
// sources it reports nothing.
func TestVetTool(t *testing.T) {
	if testing.Short() {
		t.Skip("vets asynq and go-redis")
	}
	bin := filepath.Join(t.TempDir(), "zclaimvet")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	vet := func(pkgs ...string) (string, time.Duration) {
		start := time.Now()
		cmd := exec.Command("go", append([]string{"vet", "-vettool=" + bin}, pkgs...)...)
		cmd.Dir = "../.."
		out, _ := cmd.CombinedOutput() // exit 1 when it reports
		// A fresh module cache downloads the test dependencies of what
		// it vets; those lines are go's, not the analyzer's.
		kept := regexp.MustCompile(`(?m)^go: downloading .*\n`).ReplaceAll(out, nil)
		return string(kept), time.Since(start)
	}

	out, took := vet("./...", "./example/...")
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^(\S+\.go):\d+:\d+: (racy poller|checked ZREM)`).FindAllStringSubmatch(out, -1) {
		got = append(got, filepath.ToSlash(m[1])+": "+m[2])
	}
	sort.Strings(got)
	want := []string{"bench/claim.go: checked ZREM", "example/main.go: racy poller", "example/migrate/main.go: checked ZREM"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("go vet ./... ./example/... reported %q, want %q:\n%s", got, want, out)
	}
	t.Logf("this module: %v", took)

	out, took = vet("github.com/hibiken/asynq/...", "github.com/redis/go-redis/v9/...")
	if strings.TrimSpace(out) != "" {
		t.Fatalf("reports in asynq or go-redis:\n%s", out)
	}
	t.Logf("asynq and go-redis (30 packages): %v", took)
}
