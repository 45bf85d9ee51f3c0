package wait

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// fatal records what Recv failed its test with, and ends the goroutine as
// t.Fatal does.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}

func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// recv runs Recv on a test of its own, and returns what it returned and
// what it failed with.
func recv(ch <-chan int, d time.Duration) (v int, failed string) {
	f := &fatal{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		v = Recv(f, ch, d, "the reply")
	}()
	<-done
	return v, f.msg
}

func TestRecv(t *testing.T) {
	t.Parallel()
	ch := make(chan int, 1)
	ch <- 7
	if v, failed := recv(ch, time.Second); v != 7 || failed != "" {
		t.Fatalf("a value waiting: %d, %q", v, failed)
	}
	// Nothing comes: the test fails after d, saying what it waited for.
	start := time.Now()
	if _, failed := recv(ch, 20*time.Millisecond); failed != "waited 20ms for the reply" {
		t.Fatalf("nothing came: failed with %q", failed)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("gave up after %v", took)
	}
	close(ch)
	if v, failed := recv(ch, time.Second); v != 0 || failed != "" {
		t.Fatalf("a closed channel: %d, %q", v, failed)
	}
}
