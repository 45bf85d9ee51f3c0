package main

import (
	"fmt"
	"math"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/zclaim/zclaim/internal/proc"
)

// The tests run the benchmark program as a built binary: its flag checks,
// and a smoke run of the scenarios whose tables carry counts rather than
// only timings (jobs taken more than once or lost, round trips a task,
// bytes a finished record), against a redis-server it starts itself.

var bin string

func TestMain(m *testing.M) { proc.TestMain("bench", &bin, m.Run) }

// runBench runs the binary with args in a folder of the test's own (where
// a profile named without a folder would go).
func runBench(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return proc.Run(t, t.TempDir(), bin, args...)
}

// closedPort returns an address on loopback where nothing listens.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"-only", "claim,nosuch"}, 2, `bench: -only: no scenario "nosuch" (scenarios: claim, lag,`},
		{[]string{"-rounds", "0"}, 2, "bench: -rounds must be at least 1, not 0"},
		{[]string{"-quick", "extra"}, 2, `bench: unexpected arguments ["extra"]`},
		{[]string{"-quick", "-only", "memory", "-cpuprofile", filepath.Join("no", "such", "folder", "p")}, 2, "bench: -cpuprofile: "},
		{[]string{"-quick", "-only", "memory", "-redis", closedPort(t)}, 3, "bench: Redis at 127.0.0.1:"},
	} {
		out, errOut, code := runBench(t, c.args...)
		if code != c.code || out != "" || !strings.HasPrefix(errOut, c.says) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("bench %s: exit %d, stdout %q, stderr %q; want exit %d, nothing on stdout and one line %q…",
				strings.Join(c.args, " "), code, out, errOut, c.code, c.says)
		}
	}
}

// row returns the cells of the table row whose first cell is name.
func row(t *testing.T, out, name string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "| "+name+" |") {
			return strings.Split(strings.Trim(l, "| "), " | ")
		}
	}
	t.Fatalf("no row %q in:\n%s", name, out)
	return nil
}

func TestQuickRun(t *testing.T) {
	t.Parallel()
	out, errOut, code := runBench(t, "-quick", "-only", "claim,middleware,memory")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, title := range []string{"## 1. Claim throughput", "## 3. Middleware overhead", "## Idempotency: Redis memory per finished record"} {
		if !strings.Contains(out, "\n"+title) {
			t.Errorf("no table %q in:\n%s", title, out)
		}
	}
	if n := strings.Count(out, "\n## "); n != 3 {
		t.Errorf("%d tables, want the 3 of the scenarios -only named:\n%s", n, out)
	}
	// The header names the server it started as the redis-server on PATH
	// names itself (Valkey's under make compat).
	v, err := exec.Command("redis-server", "--version").Output()
	if m := regexp.MustCompile(`^(\w+) server v=(\S+)`).FindSubmatch(v); err != nil || m == nil {
		t.Errorf("redis-server --version: %q, %v", v, err)
	} else if want := fmt.Sprintf(", %s %s on loopback;", m[1], m[2]); !strings.Contains(out, want) {
		t.Errorf("the header does not say %q:\n%s", want, out[:min(len(out), 300)])
	}
	// Every claimer but the unchecked naive poller takes each job once and
	// loses none.
	for _, name := range []string{"naive, ZREM result checked", "Lua, one job per call", "Lua batch 100, + in-flight ZADD",
		"Broker.Claim batch 10", "Broker.Claim batch 100", "Broker.Claim batch 1000", "Broker.Claim batch 100, typed jobs"} {
		if r := row(t, out, name); r[3] != "0 (0%)" {
			t.Errorf("claim table, %s: taken more than once %q, want 0 (0%%) and none lost", name, r[3])
		}
	}
	// A finished record, where the buckets hold about 100 each (as
	// DoneBuckets = records / 100 keeps them): at most 64 B of Redis.
	mem := row(t, out, "200 (records / 100), NoHistory")[3]
	if b, err := strconv.Atoi(strings.TrimSuffix(mem, " B")); err != nil || b < 16 || b > 64 {
		t.Errorf("memory: %q a finished record, want 16 to 64 B", mem)
	}
	// The middleware's success path: Begin and Complete, at most one
	// round trip each. One round has no middle half of ratios.
	r := row(t, out, "asynq + idempotency middleware")
	if r[4] != "–" {
		t.Errorf("middleware: %q the middle half of one round's ratio, want –", r[4])
	}
	if trips, err := strconv.ParseFloat(r[6], 64); err != nil || trips > 2 {
		t.Errorf("middleware: %q zclaim round trips a task, want at most 2", r[6])
	}
	// On the store's AsynqClient the Complete rides in asynq's done: the
	// Begin is the one round trip a task of its own, fewer where handlers
	// of the same moment group theirs.
	via := row(t, out, "asynq + idempotency middleware, the server on the store's `AsynqClient` (its dequeues take up to 8 tasks at a time, each marked as held; each Begin a call of the middleware's own, grouped with those of the same moment; completed in one script with asynq's done)")
	if trips, err := strconv.ParseFloat(via[6], 64); err != nil || trips > 1.05 {
		t.Errorf("middleware on AsynqClient: %q zclaim round trips a task, want at most about 1", via[6])
	}
	// CPU a task beyond asynq alone's, in the same round: none for asynq
	// alone itself, and a signed figure for the others (its size is a
	// measurement, which a smoke run under a loaded machine does not check).
	if c := row(t, out, "asynq, no middleware")[8]; c != "+0.0 µs" {
		t.Errorf("asynq alone: %q CPU a task beyond its own, want +0.0 µs", c)
	}
	if c := r[8]; !strings.HasSuffix(c, " µs") || !strings.ContainsAny(c[:1], "+-") {
		t.Errorf("middleware: %q CPU a task beyond asynq alone's, want a signed figure in µs", c)
	} else if _, err := strconv.ParseFloat(strings.TrimSuffix(c, " µs"), 64); err != nil {
		t.Errorf("middleware: %q CPU a task beyond asynq alone's: %v", c, err)
	}
}

// Table 3b swaps asynq's dequeue and done for scripts that also make a
// Begin's and a Complete's commands: seven commands a task more than asynq
// alone, in no round trip of their own (the program exits 2 when a swap
// missed a task, as it would under an asynq whose scripts take other keys);
// with the Begin's in a script of their own, eight, and nine with the
// Complete's in one too, sent beside asynq's done.
func TestQuickInside(t *testing.T) {
	t.Parallel()
	out, errOut, code := runBench(t, "-quick", "-only", "inside")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	alone, err := strconv.ParseFloat(row(t, out, "asynq alone")[4], 64)
	if err != nil {
		t.Fatal(err)
	}
	inside := row(t, out, "the records' commands inside asynq's dequeue and done scripts "+
		"(that client, hooked): a Begin's and a Complete's Redis work, no round trip of their own")[4]
	// Within half a command: the servers' own polls and beats add a few
	// commands a round, more in a slow one; with one swap missed the
	// records add 1 or 3, not 7.
	if got, err := strconv.ParseFloat(inside, 64); err != nil || math.Abs(got-(alone+7)) > 0.5 {
		t.Errorf("inside: %q Redis commands a task, want asynq alone's %.1f + 7", inside, alone)
	}
	// The Begin apart: its script call and its three commands, and the
	// Complete's four inside asynq's done.
	apart := row(t, out, "a Begin's commands in a script of their own before the handler (one round trip a task), "+
		"a Complete's inside asynq's done script (that client, hooked)")[4]
	if got, err := strconv.ParseFloat(apart, 64); err != nil || math.Abs(got-(alone+8)) > 0.5 {
		t.Errorf("Begin apart: %q Redis commands a task, want asynq alone's %.1f + 8", apart, alone)
	}
	// The Complete beside asynq's done: a script call and its four more.
	beside := row(t, out, "a Begin's commands in a script of their own before the handler, a Complete's in a script sent "+
		"in one pipeline with asynq's done (that client, hooked): one round trip a task of their own")[4]
	if got, err := strconv.ParseFloat(beside, 64); err != nil || math.Abs(got-(alone+9)) > 0.5 {
		t.Errorf("Complete beside asynq's done: %q Redis commands a task, want asynq alone's %.1f + 9", beside, alone)
	}
}

// The middle half of per-round figures: the first to the third quartile,
// and none for fewer than four rounds.
func TestMiddleHalf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    samples
		want string
	}{
		{samples{0.9, 0.5, 0.7, 0.6, 0.8, 0.4, 1.0, 0.3, 0.2}, "0.40–0.80"},
		{samples{4, 1, 3, 2}, "2.00–3.00"},
		{samples{1, 2, 3}, "–"},
	} {
		if got := c.s.middleHalf(); got != c.want {
			t.Errorf("%v: middle half %q, want %q", c.s, got, c.want)
		}
	}
}

// TestSlots: each round runs every contender once, and over as many rounds
// as contenders each runs once in each place of the round.
func TestSlots(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 9, 11} {
		at := make([]map[int]bool, n) // at[k]: the places contender k ran in
		for k := range at {
			at[k] = map[int]bool{}
		}
		for round := 1; round <= n; round++ {
			order := slots(round, n)
			seen := map[int]bool{}
			for place, k := range order {
				if k < 0 || k >= n || seen[k] {
					t.Fatalf("slots(%d, %d) = %v: not an order of the %d contenders", round, n, order, n)
				}
				seen[k], at[k][place] = true, true
			}
			if len(order) != n {
				t.Fatalf("slots(%d, %d) = %v: %d contenders, want %d", round, n, order, len(order), n)
			}
		}
		for k := range at {
			if len(at[k]) != n {
				t.Errorf("over %d rounds of %d contenders, contender %d ran in %d places, want all %d", n, n, k, len(at[k]), n)
			}
		}
	}
}

// TestShortRounds: by default a short scenario runs a round for each of its
// contenders where it has more than 9, so that each takes each place, and
// its notes say whether each did.
func TestShortRounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ n, want int }{{0, 9}, {7, 9}, {9, 9}, {11, 11}} {
		if got := shortRounds(c.n); got != c.want {
			t.Errorf("shortRounds(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	if s := turns(11, 11); !strings.HasSuffix(s, "so that each takes each place in the round in turn") {
		t.Errorf("turns(11, 11) = %q: does not say each contender took each place", s)
	}
	if s := turns(9, 11); strings.Contains(s, "each place") || !strings.Contains(s, "9 of the 11 places") {
		t.Errorf("turns(9, 11) = %q: want it to say each took 9 of the 11 places", s)
	}
}
