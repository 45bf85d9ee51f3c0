package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zclaim/zclaim/internal/exampleredis"
	"github.com/zclaim/zclaim/internal/wait"
)

// The example program runs in CI, short: every job handled once, none
// early, none lost; on its zero-setup default (the in-process Redis) and
// on a real one (REDIS_URL: ZCLAIM_EXAMPLE_REDIS_URL, else a redis-server
// of the test's own).
func TestExampleProgram(t *testing.T) {
	t.Parallel()
	for _, real := range []bool{false, true} {
		t.Run(map[bool]string{false: "in-process", true: "real"}[real], func(t *testing.T) {
			t.Parallel()
			url := ""
			if real {
				url = exampleredis.URL(t)
			}
			exampleProgram(t, url)
		})
	}
}

func exampleProgram(t *testing.T, url string) {
	var out bytes.Buffer
	code := realMain([]string{"-jobs", "300", "-over", "1s", "-timeout", exampleTimeout.String()}, &out, url)
	t.Log("\n" + out.String())
	if code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, want := range []string{
		`handled more than once \(must be 0\) +\| +0 \|`,
		`early starts \(must be 0\) +\| +0 \|`,
		`lost \(must be 0\) +\| +0 \|`,
		`\| handled +\| +305 \|`,
		`crashed claims recovered and run +\| +5 \|`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("output lacks %q", want)
		}
	}
	want := "in-process Redis"
	if url != "" {
		want = "using the Redis at "
	}
	if first, _, _ := strings.Cut(out.String(), "\n"); !strings.Contains(first, want) {
		t.Errorf("first line %q does not say which Redis it uses", first)
	}
}

// exampleTimeout bounds each example run of the tests, not the program's
// default 15 s: on a loaded machine the in-process Redis (Lua in Go, under
// the race detector) can take longer than that to finish a run that is not
// stuck.
const exampleTimeout = 60 * time.Second

func TestExampleNaive(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if code := realMain([]string{"-naive", "-jobs", "2000"}, &out, ""); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	t.Log(out.String())
	if !strings.Contains(out.String(), "ran more than once") {
		t.Fatalf("%s", out.String())
	}
}

// -metrics serves the collector's metrics while the example runs.
func TestExampleMetrics(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	url := exampleredis.URL(t)
	done := make(chan int)
	go func() {
		done <- realMain([]string{"-jobs", "100", "-over", "500ms", "-metrics", addr, "-hold", "3s", "-timeout", exampleTimeout.String()},
			io.Discard, url)
	}()
	var body string
	for deadline := time.Now().Add(exampleTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		// The run is over once the middleware completed every job.
		if regexp.MustCompile(`zclaim_middleware_tasks_total\{outcome="completed",prefix="[^"]+"\} 105\n`).MatchString(body) {
			break
		}
	}
	for _, want := range []string{`zclaim_up{key="zclaim:{zclaim-example-`, "zclaim_dispatcher_enqueued_total", "zclaim_dispatch_lag_seconds_bucket",
		"zclaim_scheduled_jobs", `outcome="completed"`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if code := wait.Recv(t, done, exampleTimeout+10*time.Second, "the example to exit"); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}
