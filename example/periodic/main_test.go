package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/zclaim/zclaim/internal/exampleredis"
)

// The periodic example runs in CI: three replicas, every tick once.
func TestPeriodicExample(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	code := run([]string{"-for", "3s"}, &out, exampleredis.URL(t))
	t.Log("\n" + out.String())
	if code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, want := range []string{"heartbeat: ", "report: ", "0 ran twice, 0 missing", "early starts: 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
