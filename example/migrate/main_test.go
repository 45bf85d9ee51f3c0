package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/zclaim/zclaim/internal/exampleredis"
)

// docs/migrating.md's program runs in CI: producers never stop, the old
// pollers and zclaim overlap, and every job runs once.
func TestMigrate(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	code := run([]string{"-phase", "700ms"}, &out, exampleredis.URL(t))
	t.Log("\n" + out.String())
	if code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if !strings.Contains(out.String(), "ran twice: 0 (must be 0); not run: 0 (must be 0)") {
		t.Fatal("output lacks the all-clear line")
	}
}

// The control: without step 1's fix the old pollers run jobs twice, and
// the program says so.
func TestMigrateRacy(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	code := run([]string{"-phase", "500ms", "-racy"}, &out, os.Getenv("ZCLAIM_EXAMPLE_REDIS_URL"))
	t.Log("\n" + out.String())
	if code != 1 || strings.Contains(out.String(), "ran twice: 0 ") {
		t.Fatalf("exit code %d: the racy pollers ran nothing twice", code)
	}
}
