package main

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/proc"
)

// serveWeb starts "zclaim web" with args on srv and returns the console's
// URL, from the line the command prints; the process stops with the test.
func serveWeb(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"web"}, args...)...)
	cmd.Env = append(append(os.Environ(), "REDIS_URL=redis://"+srv.Addr+"/0"), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut strings.Builder
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			t.Error("zclaim web did not stop on SIGINT")
		}
		if strings.Contains(errOut.String(), "s3cret") {
			t.Errorf("stderr shows the password: %s", errOut.String())
		}
	})
	line, r, err := proc.FirstLine(out, 30*time.Second)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait() // and its stderr is all copied
		t.Fatalf("zclaim web printed no address: %v\n%s", err, errOut.String())
	}
	if strings.Contains(line, "s3cret") {
		t.Errorf("stdout shows the password: %s", line)
	}
	m := regexp.MustCompile(`http://(\S+)/`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("zclaim web printed %q", line)
	}
	go io.Copy(io.Discard, r)
	u := "http://" + m[1]
	if strings.HasPrefix(m[1], "[::]") || strings.HasPrefix(m[1], "0.0.0.0") {
		u = "http://127.0.0.1:" + m[1][strings.LastIndex(m[1], ":")+1:]
	}
	return u
}

func fetch(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// zclaim web, built, serves the console of a real schedule on loopback:
// its counts, and a revive through the confirmation.
func TestWeb(t *testing.T) {
	t.Parallel()
	b, key := setup(t)
	u := serveWeb(t, nil, "--key", key, "--listen", "127.0.0.1:0")
	req, _ := http.NewRequest("GET", u+"/", nil)
	code, body := fetch(t, req)
	if code != 200 || !strings.Contains(body, `id="s0-scheduled">5<`) || !strings.Contains(body, `id="s0-dead">1<`) ||
		!strings.Contains(body, key) {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	req, _ = http.NewRequest("GET", u+"/s/0/dead", nil)
	_, body = fetch(t, req)
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, "bad address") {
		t.Fatalf("dead page:\n%s", body)
	}
	form := url.Values{"csrf": {m[1]}, "op": {"revive"}, "id": {"b-killed"}, "confirm": {"yes"}, "back": {"/s/0/dead"}}
	req, _ = http.NewRequest("POST", u+"/s/0/act", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if code, body := fetch(t, req); code != http.StatusSeeOther {
		t.Fatalf("revive: %d\n%s", code, body)
	}
	if j, err := b.Job(ctx, "b-killed"); err != nil || j.State != zclaim.StateScheduled {
		t.Fatalf("after revive: %+v %v", j, err)
	}
}

// Any address but loopback needs a password or --behind-auth; with a
// password every request needs it, and no page or output shows it;
// --read-only refuses changes.
func TestWebAuth(t *testing.T) {
	t.Parallel()
	_, key := setup(t)
	_, errOut, code := runCLI(t, srv, "web", "--key", key, "--listen", "0.0.0.0:0")
	want(t, "web on 0.0.0.0 without a password", code, exitUsage, "", errOut)
	if !strings.Contains(errOut, "ZCLAIM_WEB_PASSWORD") || !strings.Contains(errOut, "--behind-auth") {
		t.Fatalf("the refusal does not say what to do: %s", errOut)
	}
	u := serveWeb(t, []string{"ZCLAIM_WEB_PASSWORD=s3cret"}, "--key", key, "--listen", "0.0.0.0:0", "--read-only")
	for _, c := range []struct {
		user, pass string
		want       int
	}{{"", "", 401}, {"ops", "wrong", 401}, {"ops", "s3cret", 200}} {
		req, _ := http.NewRequest("GET", u+"/s/0/dead", nil)
		if c.pass != "" {
			req.SetBasicAuth(c.user, c.pass)
		}
		code, body := fetch(t, req)
		if code != c.want {
			t.Fatalf("password %q: %d, want %d", c.pass, code, c.want)
		}
		if strings.Contains(body, "s3cret") {
			t.Fatal("a page shows the password")
		}
		if code == 200 && strings.Contains(body, `name="op"`) {
			t.Fatal("--read-only shows buttons")
		}
	}
	req, _ := http.NewRequest("POST", u+"/s/0/act", strings.NewReader("op=revive&id=b-killed&confirm=yes"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("ops", "s3cret")
	if code, _ := fetch(t, req); code != http.StatusForbidden {
		t.Fatalf("POST to --read-only: %d, want 403", code)
	}
	u = serveWeb(t, nil, "--key", key, "--listen", "0.0.0.0:0", "--behind-auth")
	req, _ = http.NewRequest("GET", u+"/", nil)
	if code, _ := fetch(t, req); code != 200 {
		t.Fatalf("--behind-auth: %d", code)
	}
}

// zclaim web answers to the names it is given (--host, the --listen
// name) besides loopback ones and IP addresses, and to no other Host: a
// name rebound to its address gets 421 and no token.
func TestWebHosts(t *testing.T) {
	t.Parallel()
	_, key := setup(t)
	u := serveWeb(t, nil, "--key", key, "--listen", "localhost:0", "--host", "ops.example.test",
		"--host", "https://tls.example.test")
	for host, want := range map[string]int{"ops.example.test": 200, "tls.example.test": 200, "localhost": 200,
		"127.0.0.1": 200, "rebound.example": 421, "ops.example.test.rebound.example": 421} {
		req, _ := http.NewRequest("GET", u+"/s/0/dead", nil)
		req.Host = host
		code, body := fetch(t, req)
		if code != want || (want == 421) == strings.Contains(body, `name="csrf"`) {
			t.Errorf("Host %s: %d, want %d\n%.300s", host, code, want, body)
		}
	}
}

// zclaim web refuses to start on a Redis it cannot use, and a rediss://
// URL on a server without TLS fails within its dial timeout with a
// message that says TLS.
func TestWebRefusesRedis(t *testing.T) {
	t.Parallel()
	_, key := setup(t)
	start := time.Now()
	c := exec.Command(bin, "web", "--key", key, "--listen", "127.0.0.1:0", "--redis",
		"rediss://"+srv.Addr+"/0?dial_timeout=300ms")
	out, _ := c.CombinedOutput()
	if c.ProcessState.ExitCode() != exitRedis || !strings.Contains(string(out), "TLS handshake") ||
		time.Since(start) > 3*time.Second {
		t.Fatalf("rediss:// on a plain server: exit %d after %v:\n%s", c.ProcessState.ExitCode(),
			time.Since(start), out)
	}
	c = exec.Command(bin, "web", "--key", key, "--listen", "127.0.0.1:0", "--redis", "redis://127.0.0.1:1/0")
	out, _ = c.CombinedOutput()
	if c.ProcessState.ExitCode() != exitRedis || !strings.Contains(string(out), "cannot use Redis") {
		t.Fatalf("no server: exit %d:\n%s", c.ProcessState.ExitCode(), out)
	}
}
