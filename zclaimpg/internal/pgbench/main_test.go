package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/zclaim/zclaim/internal/proc"
)

// The tests run the program as a built binary: its flag checks, and a
// short run against PostgreSQL (found as zclaimpg's tests find it; the
// program says what to install when there is none) and a redis-server it
// starts itself.

var bin string

func TestMain(m *testing.M) { proc.TestMain("pgbench", &bin, m.Run) }

func runPGBench(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return proc.Run(t, "", bin, args...)
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"-rounds", "0"}, "pgbench: -rounds must be at least 1, not 0"},
		{[]string{"-for", "0s"}, "pgbench: -for must be positive, not 0s"},
		{[]string{"-c", "0"}, "pgbench: -c must be at least 1, not 0"},
		{[]string{"-rows", "-1"}, "pgbench: -rows must be at least 1, not -1"},
		{[]string{"extra"}, `pgbench: unexpected arguments ["extra"]`},
	} {
		out, errOut, code := runPGBench(t, c.args...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, c.says) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("pgbench %s: exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout and one line %q…",
				strings.Join(c.args, " "), code, out, errOut, c.says)
		}
	}
}

func TestShortRun(t *testing.T) {
	t.Parallel()
	out, errOut, code := runPGBench(t, "-rounds", "2", "-for", "300ms", "-c", "4", "-rows", "2000")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, name := range []string{"the transaction alone", "the transaction + `zclaimpg.Complete` (`InTx`)",
		"the transaction alone, without the middleware",
		"the transaction between a plain `SET NX GET` and a plain `SET`, without the middleware"} {
		var rate string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "| "+name+" | ") {
				rate = strings.Split(strings.TrimPrefix(l, "| "+name+" | "), " | ")[0]
			}
		}
		if n, err := strconv.ParseFloat(rate, 64); err != nil || n <= 0 {
			t.Errorf("row %q: transactions/s %q, want a positive number, in:\n%s", name, rate, out)
		}
	}
	if !strings.Contains(out, "2000 rows with 36-byte keys") || !strings.Contains(out, " B per finished run**") {
		t.Errorf("no size of the done table in:\n%s", out)
	}
}
