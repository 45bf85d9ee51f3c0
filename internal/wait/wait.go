// Package wait bounds the tests' waits on a channel or a condition: a wait that runs past
// its bound fails the test, saying what it waited for, instead of hanging
// the suite until go test's own timeout, whose report names neither the
// test's step nor what never came.
package wait

import (
	"testing"
	"time"
)

// Recv returns the next value received from ch (the zero value once ch is
// closed), or fails t when none comes within d: "waited d for what".
// Call it from the goroutine running the test, as t.Fatal requires.
func Recv[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for %s", d, what)
	}
	var zero T
	return zero
}

// Until polls cond every 10 ms until it holds, or fails t when it has not
// within d: "waited d for what".
func Until(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
