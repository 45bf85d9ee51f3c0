// Package exampleredis gives the example programs' tests the Redis they
// run on. It stays out of the programs that link redisproc (the benchmark
// and the fault tests), which have no use for package testing.
package exampleredis

import (
	"os"
	"testing"

	"github.com/zclaim/zclaim/internal/redisproc"
)

// URL returns the URL of the Redis an example program's test runs on:
// ZCLAIM_EXAMPLE_REDIS_URL when it is set, else a redis-server of the
// test's own (from PATH; closed when the test ends). A test that cannot
// start one fails, saying what to install.
func URL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("ZCLAIM_EXAMPLE_REDIS_URL"); u != "" {
		return u
	}
	s, err := redisproc.Start()
	if err != nil {
		t.Fatalf("the example's test runs on a real Redis: %v (install redis-server 7 or later, or set ZCLAIM_EXAMPLE_REDIS_URL)", err)
	}
	t.Cleanup(s.Close)
	return "redis://" + s.Addr + "/0"
}
