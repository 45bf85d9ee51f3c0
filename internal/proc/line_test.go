package proc

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestFirstLine(t *testing.T) {
	line, rest, err := FirstLine(strings.NewReader("ready\nmore\n"), time.Second)
	if err != nil || line != "ready" {
		t.Fatalf("FirstLine = %q, %v", line, err)
	}
	if b, _ := io.ReadAll(rest); string(b) != "more\n" {
		t.Fatalf("the rest: %q", b)
	}
	// A child that prints nothing: an error after within, not a hang.
	r, w := io.Pipe()
	defer w.Close()
	start := time.Now()
	if line, _, err := FirstLine(r, 20*time.Millisecond); err == nil || line != "" {
		t.Fatalf("FirstLine of a silent child = %q, %v", line, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("gave up after %v", took)
	}
	// One that stops before a whole line: its part and EOF.
	if line, _, err := FirstLine(strings.NewReader("rea"), time.Second); err != io.EOF || line != "rea" {
		t.Fatalf("FirstLine of a cut line = %q, %v", line, err)
	}
}
