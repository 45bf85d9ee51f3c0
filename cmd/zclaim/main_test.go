package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/proc"
	"github.com/zclaim/zclaim/internal/redisinfo"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/internal/wait"
)

// The tests run the command as a built binary against a redis-server of
// their own: one with AOF (a healthy server), and one per problem doctor
// must catch.
var (
	bin string
	srv *redisproc.Server
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	if os.Getenv(takeoverWorker) != "" {
		runTakeoverWorker()
	}
	var err error
	if bin, err = proc.Build("zclaim"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if srv, err = redisproc.Start("--appendonly", "yes"); err != nil {
		fmt.Fprintln(os.Stderr, "the zclaim command's tests need redis-server:", err)
		os.Exit(2)
	}
	code := m.Run()
	srv.Close()
	os.Exit(code)
}

// runCLI runs the binary with args on server s and returns its stdout,
// stderr and exit code.
func runCLI(t *testing.T, s *redisproc.Server, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "REDIS_URL=redis://"+s.Addr+"/0")
	stdout, stderr, code, err := proc.Output(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return stdout, stderr, code
}

func want(t *testing.T, what string, got, want int, out, errOut string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", what, got, want, out, errOut)
	}
}

// ownKey returns a key of the test's own on srv, new in each run of it
// (go test -count), in a hash slot of its own.
func ownKey(t *testing.T) string {
	return fmt.Sprintf("cli:{%s-%d}", t.Name(), time.Now().UnixNano())
}

// setup schedules jobs on a key of the test's own: three later, two due,
// one in flight, one dead.
func setup(t *testing.T) (*zclaim.Broker, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	key := ownKey(t)
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key, Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	later, past := time.Now().Add(time.Hour), time.Now().Add(-time.Second)
	err = b.Schedule(ctx,
		zclaim.Job{ID: "a-claimed", RunAt: past.Add(-time.Minute), Type: "email"},
		zclaim.Job{ID: "b-killed", RunAt: past.Add(-time.Minute), Type: "email", Payload: []byte("{}")},
		zclaim.Job{ID: "due-1", RunAt: past, Type: "email", Queue: "mail"},
		zclaim.Job{ID: "due-2", RunAt: past, Type: "email"},
		zclaim.Job{ID: "later-1", RunAt: later, Type: "sms"},
		zclaim.Job{ID: "later-2", RunAt: later, Type: "sms"},
		zclaim.Job{ID: "later-3", RunAt: later, Type: "sms"})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := b.Claim(ctx, 2)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claim: %v %v", cs, err)
	}
	for _, c := range cs {
		if c.ID == "b-killed" {
			if err := b.Kill(ctx, c, "bad address"); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b, key
}

func TestStatsAndList(t *testing.T) {
	t.Parallel()
	_, key := setup(t)
	out, errOut, code := runCLI(t, srv, "stats", "--key", key)
	want(t, "stats", code, 0, out, errOut)
	for _, line := range []string{"scheduled   5", "due         2", "in flight   1", "dead        1"} {
		if !strings.Contains(out, line) {
			t.Fatalf("stats lacks %q:\n%s", line, out)
		}
	}
	out, errOut, code = runCLI(t, srv, "stats", "--key", key, "--json")
	want(t, "stats --json", code, 0, out, errOut)
	var st struct{ Scheduled, Due, Inflight, Dead int }
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Scheduled != 5 || st.Due != 2 || st.Inflight != 1 || st.Dead != 1 {
		t.Fatalf("stats --json: %+v %v\n%s", st, err, out)
	}

	// Paged: two pages of 3 and 2, the cursor printed on stderr.
	out, errOut, code = runCLI(t, srv, "ls", "scheduled", "--key", key, "--limit", "3")
	want(t, "ls scheduled", code, 0, out, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "due-1") || !strings.Contains(lines[1], "mail") {
		t.Fatalf("ls scheduled page 1:\n%s", out)
	}
	_, after, ok := strings.Cut(errOut, "--after ")
	if !ok {
		t.Fatalf("no cursor on stderr: %q", errOut)
	}
	var cursor string
	fmt.Sscanf(after, "%q", &cursor)
	out, errOut, code = runCLI(t, srv, "--key", key, "ls", "scheduled", "--limit", "3", "--after", cursor, "--json")
	want(t, "ls scheduled page 2", code, 0, out, errOut)
	var page zclaim.JobList
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Jobs) != 2 || page.Jobs[0].ID != "later-2" || page.Next != "" {
		t.Fatalf("page 2: %+v %v\n%s", page, err, out)
	}
	out, errOut, code = runCLI(t, srv, "ls", "inflight", "--key", key)
	want(t, "ls inflight", code, 0, out, errOut)
	if !strings.Contains(out, "a-claimed") || strings.Count(out, "\n") != 2 {
		t.Fatalf("ls inflight:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "ls", "dead", "--key", key)
	want(t, "ls dead", code, 0, out, errOut)
	if !strings.Contains(out, "b-killed") || !strings.Contains(out, "bad address") {
		t.Fatalf("ls dead:\n%s", out)
	}
	_, errOut, code = runCLI(t, srv, "ls", "nowhere", "--key", key)
	want(t, "ls nowhere", code, 2, "", errOut)
	_, errOut, code = runCLI(t, srv, "ls", "dead", "--limit", "5000", "--key", key)
	want(t, "ls --limit 5000", code, 2, "", errOut)
}

func TestShow(t *testing.T) {
	t.Parallel()
	_, key := setup(t)
	for id, state := range map[string]string{"later-1": "scheduled", "a-claimed": "in flight", "b-killed": "dead"} {
		out, errOut, code := runCLI(t, srv, "show", id, "--key", key)
		want(t, "show "+id, code, 0, out, errOut)
		if !regexp.MustCompile(`(?m)^state +`+state+`$`).MatchString(out) || !regexp.MustCompile(`(?m)^occurrence +`+id+`@`).MatchString(out) {
			t.Fatalf("show %s:\n%s", id, out)
		}
	}
	out, errOut, code := runCLI(t, srv, "show", "b-killed", "--key", key, "--json")
	want(t, "show --json", code, 0, out, errOut)
	var shown struct{ Jobs, Runs []map[string]any }
	js := shown.Jobs
	if err := json.Unmarshal([]byte(out), &shown); err == nil {
		js = shown.Jobs
	}
	if len(js) != 1 || js[0]["State"] != "dead" || js[0]["Reason"] != "bad address" || js[0]["PayloadSize"] != 2.0 || len(shown.Runs) != 0 {
		t.Fatalf("show --json: %v\n%s", shown, out)
	}
	_, errOut, code = runCLI(t, srv, "show", "nobody", "--key", key)
	want(t, "show nobody", code, 1, "", errOut)
	if !strings.Contains(errOut, "not scheduled, in flight or dead") {
		t.Fatalf("show nobody: %q", errOut)
	}
}

func TestActOnIDs(t *testing.T) {
	t.Parallel()
	b, key := setup(t)
	out, errOut, code := runCLI(t, srv, "run-now", "later-1", "--key", key)
	want(t, "run-now", code, 0, out, errOut)
	if j, _ := b.Job(ctx, "later-1"); j.RunAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("run-now left it at %v", j.RunAt)
	}
	out, errOut, code = runCLI(t, srv, "cancel", "later-2", "nobody", "--key", key)
	want(t, "cancel", code, 1, out, errOut)
	if out != "cancelled 1 of 2\n" || !strings.Contains(errOut, "nobody") || strings.Contains(errOut, "later-2") {
		t.Fatalf("cancel: %q %q", out, errOut)
	}
	if _, err := b.Job(ctx, "later-2"); err == nil {
		t.Fatal("later-2 still there")
	}
	out, errOut, code = runCLI(t, srv, "revive", "b-killed", "--key", key, "--json")
	want(t, "revive", code, 0, out, errOut)
	if !strings.Contains(out, `"done": 1`) {
		t.Fatalf("revive --json: %s", out)
	}
	if j, _ := b.Job(ctx, "b-killed"); j.State != zclaim.StateScheduled {
		t.Fatalf("revived: %+v", j)
	}
	// Kill three, revive one by name and delete the rest with --all.
	cs, err := b.Claim(ctx, 10)
	if err != nil || len(cs) < 3 {
		t.Fatalf("claim: %d %v", len(cs), err)
	}
	for _, c := range cs {
		b.Kill(ctx, c, "test")
	}
	_, errOut, code = runCLI(t, srv, "delete-dead", "--key", key)
	want(t, "delete-dead with nothing", code, 2, "", errOut)
	out, errOut, code = runCLI(t, srv, "delete-dead", "--all", "--key", key)
	want(t, "delete-dead --all", code, 0, out, errOut)
	if out != fmt.Sprintf("deleted %d of %d\n", len(cs), len(cs)) {
		t.Fatalf("delete-dead --all: %q", out)
	}
	if st, _ := b.Stats(ctx); st.Dead != 0 {
		t.Fatalf("%d dead left", st.Dead)
	}
	out, errOut, code = runCLI(t, srv, "revive", "--all", "--key", key)
	want(t, "revive --all of none", code, 0, out, errOut)
}

func TestWatch(t *testing.T) {
	t.Parallel()
	_, key := setup(t)
	out, errOut, code := runCLI(t, srv, "watch", "--key", key, "--interval", "10ms", "--count", "3")
	want(t, "watch", code, 0, out, errOut)
	if strings.Count(out, "zclaim watch "+key) != 3 || !strings.Contains(out, "+0.0/s") || !strings.Contains(out, "oldest due") {
		t.Fatalf("watch:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "watch", "--key", key, "--interval", "10ms", "--count", "2", "--json")
	want(t, "watch --json", code, 0, out, errOut)
	if strings.Count(out, "\n") != 2 || !strings.Contains(out, `"scheduled":5`) {
		t.Fatalf("watch --json:\n%s", out)
	}
}

func TestDoctor(t *testing.T) {
	t.Parallel()
	_, key := setup(t)
	out, errOut, code := runCLI(t, srv, "doctor", "--key", key)
	want(t, "doctor on a healthy server", code, 0, out, errOut)
	if strings.Count(out, "ok ") != 7 {
		t.Fatalf("doctor:\n%s", out)
	}
	// A process of the store (--runs) found a part of the asynq adapter
	// off, as NewIdempotency and the store's AsynqClient report it: doctor
	// names it, a problem.
	prefix := key + ":run:"
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	rerr := rc.HSet(ctx, prefix+"\x00done:adapter", "asynq v0.27.0: its dequeue script is not the one zclaim knows",
		time.Now().UnixMilli()).Err()
	rc.Close()
	if rerr != nil {
		t.Fatal(rerr)
	}
	out, errOut, code = runCLI(t, srv, "doctor", "--key", key, "--runs", prefix)
	want(t, "doctor with an adapter report", code, 1, out, errOut)
	if !strings.Contains(out, "PROBLEM  asynq adapter    asynq v0.27.0: its dequeue script") {
		t.Fatalf("doctor does not name the adapter's report:\n%s", out)
	}
	// The server by its own name and version: Redis's, or Valkey's (make
	// compat), whose redis_version is the Redis it is compatible with.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	info, err := c.Info(ctx, "server").Result()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	server := "redis " + redisinfo.Field(info, "redis_version")
	if v := redisinfo.Field(info, "valkey_version"); v != "" {
		server = "valkey " + v
	}
	if !regexp.MustCompile(`(?m)^ok +version +` + regexp.QuoteMeta(server) + `$`).MatchString(out) {
		t.Fatalf("doctor does not name the server %q:\n%s", server, out)
	}

	// An evicting server without persistence, members without a type, and
	// a key of the wrong type: each a problem with its fix.
	bad, err := redisproc.Start("--maxmemory-policy", "allkeys-lru")
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	rdb := redis.NewClient(&redis.Options{Addr: bad.Addr})
	defer rdb.Close()
	rdb.ZAdd(ctx, "delay:jobs", redis.Z{Score: 1, Member: "order-731"})
	out, errOut, code = runCLI(t, bad, "doctor", "--key", "delay:jobs", "--no-default-type")
	want(t, "doctor on allkeys-lru", code, 1, out, errOut)
	for _, s := range []string{"PROBLEM  eviction", "maxmemory-policy allkeys-lru", "fix: CONFIG SET maxmemory-policy noeviction",
		"PROBLEM  persistence", "PROBLEM  typeless members", "fix: set DispatcherOptions.DefaultType", "3 problem(s)"} {
		if !strings.Contains(out, s) {
			t.Fatalf("doctor lacks %q:\n%s", s, out)
		}
	}
	// Without --no-default-type, members without a type are information:
	// a plain ZADD's, which docs/migrating.md recommends keeping.
	out, errOut, code = runCLI(t, bad, "doctor", "--key", "delay:jobs")
	want(t, "doctor on allkeys-lru", code, 1, out, errOut)
	if !strings.Contains(out, "ok       typeless members about 1 of 1 scheduled members have no task type") ||
		!strings.Contains(out, "2 problem(s)") {
		t.Fatalf("doctor without --no-default-type:\n%s", out)
	}
	out, errOut, code = runCLI(t, bad, "doctor", "--key", "delay:jobs", "--default-type", "order", "--json")
	want(t, "doctor --json", code, 1, out, errOut)
	var rep struct{ Problems int }
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Problems != 2 {
		t.Fatalf("doctor --json: %+v %v\n%s", rep, err, out)
	}
	// RDB snapshots only: a crash rolls back, and finished work runs again.
	rdb.ConfigSet(ctx, "save", "3600 1")
	out, errOut, code = runCLI(t, bad, "doctor", "--key", "delay:jobs")
	want(t, "doctor with RDB only", code, 1, out, errOut)
	if !regexp.MustCompile(`PROBLEM  persistence .*RDB save points`).MatchString(out) ||
		!strings.Contains(out, "a crash rolls back to the last save: work finished since runs again") || !strings.Contains(out, "appendonly yes") {
		t.Fatalf("doctor with RDB only:\n%s", out)
	}
	rdb.Set(ctx, "{delay:jobs}:inflight", "x", 0)
	out, errOut, code = runCLI(t, bad, "doctor", "--key", "delay:jobs")
	want(t, "doctor with a wrong type", code, 1, out, errOut)
	if !strings.Contains(out, "{delay:jobs}:inflight is a string, not a zset") {
		t.Fatalf("doctor with a wrong type:\n%s", out)
	}
}

// Usage errors exit 2; a Redis that is not there exits 3; a key of the
// wrong type exits 3 and names it.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	_, errOut, code := runCLI(t, srv)
	want(t, "no command", code, 2, "", errOut)
	_, errOut, code = runCLI(t, srv, "frobnicate")
	want(t, "unknown command", code, 2, "", errOut)
	_, errOut, code = runCLI(t, srv, "stats", "--unit", "h")
	want(t, "bad unit", code, 2, "", errOut)
	_, errOut, code = runCLI(t, srv, "show")
	want(t, "show without id", code, 2, "", errOut)
	for _, cluster := range [][]string{nil, {"--cluster"}} {
		_, errOut, code = runCLI(t, srv, append([]string{"stats", "--redis", "redis://127.0.0.1:1"}, cluster...)...)
		want(t, fmt.Sprint("no server ", cluster), code, 3, "", errOut)
		// One line that says what failed, without go-redis' log of each
		// failed dial.
		if lines := strings.Split(strings.TrimSpace(errOut), "\n"); len(lines) != 1 ||
			!strings.HasPrefix(lines[0], "zclaim: stats: ") || !strings.Contains(lines[0], "connection refused") {
			t.Fatalf("no server %s: stderr %q, want one line saying the connection was refused", cluster, errOut)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	wrong := ownKey(t)
	rdb.Set(ctx, wrong, "x", 0)
	defer rdb.Del(ctx, wrong)
	_, errOut, code = runCLI(t, srv, "stats", "--key", wrong)
	want(t, "wrong type", code, 3, "", errOut)
	if !strings.Contains(errOut, "zclaim:") || !strings.Contains(errOut, wrong) {
		t.Fatalf("wrong type: %q", errOut)
	}
}

// The operator's ACL line of docs/operations.md is enough for every
// subcommand.
func TestACLOperator(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^ACL SETUSER operator .*$`).Find(doc)
	if line == nil {
		t.Fatal("docs/operations.md has no line for the operator")
	}
	s, err := redisproc.Start("--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer admin.Close()
	var args []any
	for _, w := range strings.Fields(string(line)) {
		args = append(args, w)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	b, err := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: "delay:jobs", Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Schedule(ctx, zclaim.Job{ID: "a", RunAt: time.Now().Add(-time.Second), Type: "t"},
		zclaim.Job{ID: "b", RunAt: time.Now().Add(time.Hour), Type: "t"}, zclaim.Job{ID: "c", RunAt: time.Now().Add(time.Hour), Type: "t"}); err != nil {
		t.Fatal(err)
	}
	cs, err := b.Claim(ctx, 1)
	if err != nil || len(cs) != 1 {
		t.Fatal(cs, err)
	}
	b.Kill(ctx, cs[0], "test")
	url := "redis://operator:s3cret@" + s.Addr
	for _, cmd := range [][]string{{"stats"}, {"ls", "scheduled"}, {"ls", "inflight"}, {"ls", "dead"}, {"show", "a"},
		{"run-now", "b"}, {"cancel", "c"}, {"revive", "a"}, {"delete-dead", "--all"}, {"watch", "--count", "1"}, {"doctor"}} {
		out, errOut, code := runCLI(t, s, append(cmd, "--key", "delay:jobs", "--redis", url)...)
		want(t, strings.Join(cmd, " ")+" as the operator", code, 0, out, errOut)
		if cmd[0] == "doctor" && strings.Contains(out, "unknown") {
			t.Fatalf("doctor as the operator could not read everything:\n%s", out)
		}
	}
	// And no more: asynq's keys are not the operator's.
	op := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "operator", Password: "s3cret"})
	defer op.Close()
	if err := op.Get(ctx, "asynq:queues").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("the operator may read asynq's keys: %v", err)
	}
}

// --cluster: the command on a Redis Cluster (one node holding every slot).
func TestCluster(t *testing.T) {
	t.Parallel()
	s, err := redisproc.Start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer admin.Close()
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, _ := admin.ClusterInfo(ctx).Result(); strings.Contains(info, "cluster_state:ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cluster is not ok")
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.Addr}})
	defer cc.Close()
	b, err := zclaim.NewBroker(cc, zclaim.BrokerOptions{Key: "delay:jobs"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Schedule(ctx, zclaim.Job{ID: "order-731", RunAt: time.Now().Add(time.Hour), Type: "t"}); err != nil {
		t.Fatal(err)
	}
	url := "redis://" + s.Addr
	for _, cmd := range [][]string{{"stats"}, {"ls", "scheduled"}, {"show", "order-731"}, {"doctor"}, {"run-now", "order-731"}} {
		out, errOut, code := runCLI(t, s, append(cmd, "--cluster", "--key", "delay:jobs", "--redis", url)...)
		want(t, strings.Join(cmd, " ")+" --cluster", code, 0, out, errOut)
		if cmd[0] == "show" && !strings.Contains(out, "order-731@") {
			t.Fatalf("show on the cluster:\n%s", out)
		}
	}
}

// audit reads sets scored in seconds, in milliseconds and with JSON
// members, as a user that may only read, and writes nothing: the test has
// a server of its own, whose keys it counts.
func TestAudit(t *testing.T) {
	t.Parallel()
	s, err := redisproc.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	if err := rdb.Do(ctx, "ACL", "SETUSER", "auditor", "on", ">s3cret", "~audit:*", "~{audit:*", "nocommands", "+@read", "+@connection", "+time").Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var sec, milli, js []redis.Z
	for i := range 500 {
		at := now.Add(time.Duration(i-100) * time.Minute)
		id := fmt.Sprintf("order-%d", i)
		sec = append(sec, redis.Z{Score: float64(at.Unix()), Member: id})
		milli = append(milli, redis.Z{Score: float64(at.UnixMilli()), Member: id})
		// A fraction of its own: at's milliseconds are 000 one time in a thousand.
		js = append(js, redis.Z{Score: float64(at.Unix()) + 0.25, Member: fmt.Sprintf(`{"order":%d,"kind":"reminder"}`, i)})
	}
	rdb.ZAdd(ctx, "audit:sec", sec...)
	rdb.ZAdd(ctx, "audit:ms", milli...)
	rdb.ZAdd(ctx, "audit:json", js...)
	rdb.Set(ctx, "audit:str", "x", 0)
	keysBefore, _ := rdb.DBSize(ctx).Result()
	url := "redis://auditor:s3cret@" + s.Addr

	audit := func(key string, code int) audit {
		out, errOut, got := runCLI(t, s, "audit", "--key", key, "--json", "--redis", url)
		want(t, "audit "+key, got, code, out, errOut)
		var a audit
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("audit %s: %v\n%s", key, err, out)
		}
		return a
	}
	a := audit("audit:sec", 0)
	if a.Unit != "s" || a.Members != 500 || a.Due < 99 || a.Due > 102 || a.OldestDue < 99*60 || a.Payloads != 0 ||
		!strings.Contains(strings.Join(a.Fits, "\n"), "DefaultType") {
		t.Fatalf("seconds: %+v", a)
	}
	a = audit("audit:ms", 0)
	if a.Unit != "ms" || a.Due < 99 || a.Due > 102 || !strings.Contains(strings.Join(a.Fits, "\n"), "time.Millisecond") {
		t.Fatalf("milliseconds: %+v", a)
	}
	a = audit("audit:json", 0)
	if a.Unit != "s with fractions" || a.Payloads != a.Sampled || a.Sampled < 100 || !strings.Contains(strings.Join(a.Fits, "\n"), "docs/migrating.md") {
		t.Fatalf("JSON members: %+v", a)
	}
	if a := audit("audit:str", 1); a.Type != "string" {
		t.Fatalf("a string: %+v", a)
	}
	if a := audit("audit:none", 1); a.Type != "none" {
		t.Fatalf("no key: %+v", a)
	}
	out, errOut, code := runCLI(t, s, "audit", "--key", "audit:sec", "--redis", url)
	want(t, "audit as a table", code, 0, out, errOut)
	if !strings.Contains(out, "score unit  s") && !regexp.MustCompile(`score unit +s\n`).MatchString(out) {
		t.Fatalf("audit table:\n%s", out)
	}
	if keysAfter, _ := rdb.DBSize(ctx).Result(); keysAfter != keysBefore {
		t.Fatalf("audit wrote: %d keys before, %d after", keysBefore, keysAfter)
	}
}

// A sharded schedule opens with its recorded count: stats, ls and show
// see every shard.
func TestSharded(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	key := ownKey(t)
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	var jobs []zclaim.Job
	for i := range 40 {
		jobs = append(jobs, zclaim.Job{ID: fmt.Sprint("s-", i), RunAt: time.Now().Add(time.Hour), Type: "t"})
	}
	if err := b.Schedule(ctx, jobs...); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, srv, "stats", "--key", key, "--json")
	want(t, "stats", code, 0, out, errOut)
	if !strings.Contains(out, `"Scheduled": 40`) {
		t.Fatalf("stats of a sharded schedule:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "ls", "scheduled", "--key", key, "--limit", "1000")
	want(t, "ls", code, 0, out, errOut)
	if strings.Count(out, "\n") != 41 {
		t.Fatalf("ls of a sharded schedule:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "show", "s-17", "--key", key)
	want(t, "show", code, 0, out, errOut)
}

// ls periodic lists the definitions with their next ticks, and one that
// cannot be read here with its error.
func TestListPeriodic(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	key := ownKey(t)
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeriodic(ctx, zclaim.Periodic{Name: "report", Spec: "0 6 * * *", Type: "report"},
		zclaim.Periodic{Name: "beat", Spec: "@every 1m", Type: "beat", Missed: zclaim.SkipMissed}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, srv, "ls", "periodic", "--key", key)
	want(t, "ls periodic", code, 0, out, errOut)
	if !regexp.MustCompile(`(?m)^beat +@every 1m +UTC +beat +- +\S+Z \(in `).MatchString(out) || !strings.Contains(out, "0 6 * * *") {
		t.Fatalf("ls periodic:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "ls", "periodic", "--key", key, "--json")
	want(t, "ls periodic --json", code, 0, out, errOut)
	if !strings.Contains(out, `"Missed": "skip"`) || strings.Contains(out, `"Error"`) {
		t.Fatalf("ls periodic --json:\n%s", out)
	}
	// A definition whose time zone does not load here is listed all the
	// same, its error on stderr, with exit code 1.
	defs := key + ":periodic" // the key has a hash tag: its keys keep it
	js, err := rdb.HGet(ctx, defs, "beat").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, defs, "beat", strings.Replace(js, `"tz":"UTC"`, `"tz":"Nowhere/Atlantis"`, 1)).Err(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, srv, "ls", "periodic", "--key", key)
	if code != 1 || !regexp.MustCompile(`(?m)^beat +@every 1m +\? +beat `).MatchString(out) || !strings.Contains(out, "0 6 * * *") ||
		!strings.Contains(errOut, `time zone "Nowhere/Atlantis" does not load`) {
		t.Fatalf("ls periodic with a definition that cannot be read: exit %d\n%s\nstderr: %s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, srv, "ls", "periodic", "--key", key, "--json")
	if code != 1 || !strings.Contains(out, `"Error": "zclaim: corrupt value: periodic \"beat\": time zone`) {
		t.Fatalf("ls periodic --json with a definition that cannot be read: exit %d\n%s\nstderr: %s", code, out, errOut)
	}
}

// A run whose worker is gone (an asynq task still active, its run record's
// lease run out, as a SIGKILLed worker leaves it) shows in stats, ls
// running and show.
func TestAbandonedRun(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	queue := fmt.Sprint("cli-abandoned-", time.Now().UnixNano())
	prefix := ownKey(t) + ":run:"
	// A worker whose handler never returns: the task stays active.
	asrv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 2,
		TaskCheckInterval: 10 * time.Millisecond, Logger: redisproc.QuietAsynq{}, LogLevel: asynq.FatalLevel})
	block := make(chan struct{})
	started := make(chan struct{}, 1)
	if err := asrv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		started <- struct{}{}
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(block); asrv.Shutdown() })
	c := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { c.Close() })
	if _, err := c.Enqueue(asynq.NewTask("order:reminder", nil), asynq.Queue(queue), asynq.TaskID("order-14")); err != nil {
		t.Fatal(err)
	}
	wait.Recv(t, started, 30*time.Second, "the handler of order-14 to start")
	if _, err := c.Enqueue(asynq.NewTask("order:reminder", nil), asynq.Queue(queue), asynq.TaskID("order-15")); err != nil {
		t.Fatal(err)
	}
	wait.Recv(t, started, 30*time.Second, "the handler of order-15 to start")
	// Its run began and its worker died: the record's lease runs out.
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: prefix, Lease: 20 * time.Millisecond,
		DisableTakeover: true, AllowEviction: true})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.Begin(ctx, "order-14")
	if err != nil {
		t.Fatal(err)
	}
	// order-15's run finished, its task still active (its worker died
	// before asynq's done).
	e15, err := idem.Begin(ctx, "order-15")
	if err != nil {
		t.Fatal(err)
	}
	if err := e15.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)

	out, errOut, code := runCLI(t, srv, "stats", "--runs", prefix)
	want(t, "stats", code, 0, out, errOut)
	if !regexp.MustCompile(`(?m)^abandoned +1 `).MatchString(out) {
		t.Fatalf("stats:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "ls", "running", "--runs", prefix, "--json")
	want(t, "ls running", code, 0, out, errOut)
	var l struct {
		Runs []zclaim.RunInfo
		Next string
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var found *zclaim.RunInfo
	for i, r := range l.Runs {
		if r.Key == "order-14" {
			found = &l.Runs[i]
		}
	}
	if found == nil || found.State != zclaim.RunAbandoned || found.Token != e.Token || found.TaskID != "order-14" || found.Queue != queue {
		t.Fatalf("ls running: %+v\n%s", found, out)
	}
	if strings.Contains(out, "order-15") {
		t.Fatalf("ls running lists a finished run:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "ls", "running", "--runs", prefix, "--all")
	want(t, "ls running --all", code, 0, out, errOut)
	if !regexp.MustCompile(`(?m)^order-15 +finished `).MatchString(out) || !regexp.MustCompile(`(?m)^order-14 +abandoned `).MatchString(out) {
		t.Fatalf("ls running --all:\n%s", out)
	}
	out, errOut, code = runCLI(t, srv, "show", "order-14", "--runs", prefix)
	want(t, "show", code, 0, out, errOut)
	for _, w := range []string{`(?m)^state +abandoned$`, `(?m)^token +` + strconv.FormatInt(e.Token, 10) + `$`, `(?m)^asynq task +` + queue + `/order-14 `, `(?m)^lease until +.* ago\)$`} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Fatalf("show: no %s in\n%s", w, out)
		}
	}
}

// No output of any subcommand shows a password: not for a malformed URL
// (in --redis or $REDIS_URL), nor for a wrong password, which every
// subcommand reports as WRONGPASS.
func TestNoPasswordShown(t *testing.T) {
	t.Parallel()
	s, err := redisproc.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close) // after the subtests
	admin := redis.NewClient(&redis.Options{Addr: s.Addr})
	if err := admin.ConfigSet(ctx, "requirepass", "right-one").Err(); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	_, port, _ := strings.Cut(s.Addr, ":")
	const secret = "Sup3rS3cret"
	cmds := [][]string{{"stats"}, {"ls", "scheduled"}, {"ls", "inflight"}, {"ls", "dead"}, {"ls", "running"}, {"ls", "periodic"},
		{"show", "a"}, {"cancel", "a"}, {"run-now", "a"}, {"revive", "a"}, {"delete-dead", "a"}, {"watch", "--count", "1"},
		{"doctor"}, {"audit"}, {"web", "--listen", "127.0.0.1:0"}}
	bad := []string{
		"redis://:" + secret + "@127.0.0.1:abc/0",
		"redis://:" + secret + "%zz@127.0.0.1:" + port + "/0",
		"redis://us er:" + secret + "@127.0.0.1:" + port + "/0",
		"redis://:" + secret + "@127.0.0.1:" + port + "/x" + secret,
		"rediss://:" + secret + "@[::1:" + port,
	}
	for _, cmd := range cmds {
		t.Run(strings.Join(cmd, " "), func(t *testing.T) {
			t.Parallel()
			for _, u := range bad {
				for _, viaEnv := range []bool{false, true} {
					args := cmd
					env := "REDIS_URL=" + u
					if !viaEnv {
						args = append(slices.Clone(cmd), "--redis", u)
						env = "REDIS_URL="
					}
					c := exec.Command(bin, args...)
					c.Env = append(os.Environ(), env)
					out, _ := c.CombinedOutput()
					if strings.Contains(string(out), secret) || strings.Contains(string(out), "S3cret") {
						t.Fatalf("zclaim %v with %q (env %v) shows the password:\n%s", cmd, u, viaEnv, out)
					}
					if c.ProcessState.ExitCode() != exitUsage {
						t.Fatalf("zclaim %v with %q: exit %d, want %d\n%s", cmd, u, c.ProcessState.ExitCode(), exitUsage, out)
					}
				}
			}
			// A well-formed URL with a wrong password.
			c := exec.Command(bin, append(slices.Clone(cmd), "--redis", "redis://:"+secret+"@"+s.Addr+"/0")...)
			out, _ := c.CombinedOutput()
			if strings.Contains(string(out), secret) {
				t.Fatalf("zclaim %v with a wrong password shows it:\n%s", cmd, out)
			}
			if !strings.Contains(string(out), "WRONGPASS") || c.ProcessState.ExitCode() == 0 {
				t.Fatalf("zclaim %v with a wrong password: exit %d, want WRONGPASS:\n%s", cmd, c.ProcessState.ExitCode(), out)
			}
		})
	}
}

// ls running lists the runs of the queues it can read, names on stderr a
// queue whose keys are of another type than asynq's, and exits 1.
func TestRunningPastHostileQueue(t *testing.T) {
	t.Parallel()
	own, err := redisproc.Start() // asynq's queues are listed server-wide: the test's alone
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	rdb := redis.NewClient(&redis.Options{Addr: own.Addr})
	t.Cleanup(func() { rdb.Close() })
	for _, q := range []string{"fine", "hostile", "hostile2"} {
		if err := rdb.SAdd(ctx, "asynq:queues", q).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{"hostile", "hostile2"} {
		if err := rdb.Set(ctx, "asynq:{"+q+"}:active", "junk", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code := runCLI(t, own, "ls", "running", "--runs", "cli:run:")
	want(t, "ls running", code, 1, out, errOut)
	if !strings.HasPrefix(out, "KEY ") || !strings.Contains(errOut, `zclaim: asynq queue "hostile" cannot be read: `) ||
		!strings.Contains(errOut, "\n"+`zclaim: asynq queue "hostile2" cannot be read: `) {
		t.Fatalf("ls running:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}

	// show: the job, and the queue whose runs it could not read on
	// stderr (the runs are shown as far as they can be read: exit 0, as
	// for an operator whose ACL stops at the schedule, TestACLOperator);
	// a job whose record does not decode is not all there: exit 1, for
	// show and ls.
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "cli:jobs"})
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := b.Schedule(ctx, zclaim.Job{ID: "j1", RunAt: later, Type: "t"}, zclaim.Job{ID: "j2", RunAt: later, Type: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, "{cli:jobs}:jobs", "j2", "junk").Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"show", "j1"}, {"show", "j1", "--json"}} {
		out, errOut, code = runCLI(t, own, append(args, "--key", "cli:jobs", "--runs", "cli:run:")...)
		want(t, strings.Join(args, " "), code, 0, out, errOut)
		if !strings.Contains(out, "scheduled") || !strings.Contains(errOut, `zclaim: asynq queue "hostile" cannot be read: `) {
			t.Fatalf("%s:\nstdout:\n%s\nstderr:\n%s", args, out, errOut)
		}
	}
	for _, args := range [][]string{{"show", "j2"}, {"show", "j2", "--json"}, {"ls", "scheduled"}, {"ls", "scheduled", "--json"}} {
		out, errOut, code = runCLI(t, own, append(args, "--key", "cli:jobs", "--runs", "cli:run:")...)
		want(t, strings.Join(args, " "), code, 1, out, errOut)
		said := out + errOut
		if args[len(args)-1] == "--json" { // the job's Error, JSON's own
			var got struct{ Jobs []struct{ ID, Error string } }
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%s: %v\n%s", args, err, out)
			}
			said = ""
			for _, j := range got.Jobs {
				if j.ID == "j1" && j.Error != "" {
					t.Fatalf("%s: j1 has an error: %s", args, out)
				}
				if j.ID == "j2" {
					said = j.Error
				}
			}
		}
		if !strings.Contains(said, `zclaim: job "j2": `) {
			t.Fatalf("%s:\nstdout:\n%s\nstderr:\n%s", args, out, errOut)
		}
	}
}
