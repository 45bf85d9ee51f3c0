package logbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Writes from many goroutines all arrive, whole, while String and Reset
// are called beside them (run with -race).
func TestBufferConcurrent(t *testing.T) {
	t.Parallel()
	var b Buffer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				fmt.Fprintf(&b, "g%d-%d\n", g, i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	if len(seen) != 800 {
		t.Fatalf("%d distinct lines, want 800: writes interleaved", len(seen))
	}
	b.Reset()
	if s := b.String(); s != "" {
		t.Fatalf("after Reset: %q", s)
	}
}
