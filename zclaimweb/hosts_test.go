package zclaimweb_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimweb"
	"github.com/zclaim/zclaim/zclaimweb/internal/webtest"
)

// do sends a request to u with the Host header host (the connection
// still goes to u's address, as after DNS rebinding) and the headers h.
func do(t *testing.T, method, u, host string, form url.Values, h ...string) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(h); i += 2 {
		req.Header.Set(h[i], h[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A request whose Host is a name the console was not told of (a page on
// a name rebound to the console's address) gets 421 and no token, and
// its POST changes nothing, even with a valid token and an Origin equal
// to its Host; a named host, a loopback name and the address work.
func TestDNSRebinding(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{Hosts: []string{"ops.example.test", "pinned.example.test:8443"}})
	e.Kill(t, "dead-1", "boom")
	port := strings.TrimPrefix(e.URL[strings.LastIndex(e.URL, ":"):], ":")
	port = strings.TrimSuffix(port, "/zclaim")
	_, page := get(t, e.URL+"/s/0/dead")
	tok := csrf(t, page)

	for _, host := range []string{"attacker.example:" + port, "attacker.example", "ops.example.test.attacker.example",
		"pinned.example.test:" + port, "localhost.attacker.example", "evil.test:" + port, ""} {
		if host == "" {
			continue
		}
		for _, p := range []string{"/s/0/dead", "/", "/api/stats", "/assets/console.css"} {
			code, body := do(t, "GET", e.URL+p, host, nil)
			if code != http.StatusMisdirectedRequest || strings.Contains(body, tok) || strings.Contains(body, "dead-1") {
				t.Errorf("GET %s with Host %s: %d, want 421 and nothing of the console:\n%.300s", p, host, code, body)
			}
		}
		form := url.Values{"csrf": {tok}, "op": {"revive"}, "id": {"dead-1"}, "confirm": {"yes"}}
		if code, _ := do(t, "POST", e.URL+"/s/0/act", host, form, "Origin", "http://"+host); code != http.StatusMisdirectedRequest {
			t.Errorf("POST with Host %s and its own Origin: %d, want 421", host, code)
		}
	}
	if j, err := e.Broker.Job(ctx, "dead-1"); err != nil || j.State != zclaim.StateDead {
		t.Fatalf("after the rebound POSTs: %+v %v", j, err)
	}
	for _, host := range []string{"ops.example.test:" + port, "OPS.example.test", "localhost:" + port,
		"console.localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "pinned.example.test:8443"} {
		if code, body := do(t, "GET", e.URL+"/s/0/dead", host, nil); code != 200 || !strings.Contains(body, tok) {
			t.Errorf("GET with Host %s: %d, want 200 and the page", host, code)
		}
	}
	// The named host's POST from its own origin works.
	host := "ops.example.test:" + port
	form := url.Values{"csrf": {tok}, "op": {"revive"}, "id": {"dead-1"}, "confirm": {"yes"}}
	if code, body := do(t, "POST", e.URL+"/s/0/act", host, form, "Origin", "http://"+host); code != http.StatusSeeOther {
		t.Fatalf("POST from the named host: %d\n%s", code, body)
	}
	if j, err := e.Broker.Job(ctx, "dead-1"); err != nil || j.State != zclaim.StateScheduled {
		t.Fatalf("after the named host's POST: %+v %v", j, err)
	}
}

// A form's Origin must be the console's own by scheme, host and port:
// an https Origin on an http console, another port, or another host is
// refused and changes nothing; a port the scheme implies may be left out.
func TestOriginByScheme(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{Hosts: []string{"ops.example.test", "https://tls.example.test"}})
	e.Kill(t, "dead-1", "boom")
	u, _ := url.Parse(e.URL)
	_, page := get(t, e.URL+"/s/0/dead")
	tok := csrf(t, page)
	form := url.Values{"csrf": {tok}, "op": {"revive"}, "id": {"dead-1"}, "confirm": {"yes"}}
	for _, c := range []struct{ host, origin string }{
		{u.Host, "https://" + u.Host},
		{u.Host, "http://" + u.Hostname() + ":1"},
		{u.Host, "http://" + u.Hostname()},
		{u.Host, "http://localhost:" + u.Port()},
		{"ops.example.test", "https://ops.example.test"},
		{"ops.example.test", "http://ops.example.test:8080"},
		{"tls.example.test", "http://tls.example.test"},
		{u.Host, "not a url"},
	} {
		if code, _ := do(t, "POST", e.URL+"/s/0/act", c.host, form, "Origin", c.origin); code != http.StatusForbidden {
			t.Errorf("Host %s, Origin %s: %d, want 403", c.host, c.origin, code)
		}
	}
	if j, err := e.Broker.Job(ctx, "dead-1"); err != nil || j.State != zclaim.StateDead {
		t.Fatalf("after refused POSTs: %+v %v", j, err)
	}
	for i, c := range []struct{ host, origin string }{
		{"ops.example.test", "http://ops.example.test:80"},
		{"ops.example.test:80", "http://ops.example.test"},
		{"tls.example.test", "https://tls.example.test"}, // a proxy ends TLS
		{u.Host, "http://" + u.Host},
	} {
		id := "ok-" + string(rune('a'+i))
		e.Kill(t, id, "boom")
		f := url.Values{"csrf": {tok}, "op": {"revive"}, "id": {id}, "confirm": {"yes"}}
		if code, body := do(t, "POST", e.URL+"/s/0/act", c.host, f, "Origin", c.origin); code != http.StatusSeeOther {
			t.Errorf("Host %s, Origin %s: %d, want 303\n%.300s", c.host, c.origin, code, body)
		}
	}

	// A console served over TLS takes https Origins and refuses http ones.
	h, err := zclaimweb.New(zclaimweb.Options{Schedules: []*zclaim.Broker{e.Broker}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	c := srv.Client()
	c.CheckRedirect = noRedirect.CheckRedirect
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	resp, err := c.Get(srv.URL + "/s/0/dead")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	tok = csrf(t, string(b))
	for origin, want := range map[string]int{"http://" + srv.Listener.Addr().String(): 403,
		"https://" + srv.Listener.Addr().String(): 303} {
		e.Kill(t, "tls-1", "boom")
		req, _ := http.NewRequest("POST", srv.URL+"/s/0/act", strings.NewReader(url.Values{"csrf": {tok},
			"op": {"revive"}, "id": {"tls-1"}, "confirm": {"yes"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("TLS console, Origin %s: %d, want %d", origin, resp.StatusCode, want)
		}
	}
}

// New refuses a Hosts entry that is not a host name.
func TestHostsRefused(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	for _, h := range []string{"", "ftp://x.test", "x.test/path", "user@x.test", "*", "x.test:1:2"} {
		if _, err := zclaimweb.New(zclaimweb.Options{Schedules: []*zclaim.Broker{e.Broker}, Hosts: []string{h}}); err == nil {
			t.Errorf("Hosts %q accepted", h)
		}
	}
}

// An id zclaim cannot handle (over MaxIDLen, not UTF-8) gets a 400 page,
// on the job page and in an action, and changes nothing; a listing of
// very long plain members shows each cut, with no link or checkbox.
func TestBadIDs(t *testing.T) {
	t.Parallel()
	e := webtest.New(t, webtest.Options{})
	e.Kill(t, "dead-1", "boom")
	long := strings.Repeat("x", 600)
	for _, id := range []string{long, "a\xffb"} {
		code, body := get(t, e.URL+"/s/0/job?id="+url.QueryEscape(id))
		if code != http.StatusBadRequest || !strings.Contains(body, "zclaim handles") {
			t.Errorf("job page of a bad id: %d, want 400\n%.300s", code, body)
		}
	}
	_, page := get(t, e.URL+"/s/0/dead")
	form := url.Values{"csrf": {csrf(t, page)}, "op": {"delete"}, "id": {"dead-1", long}, "confirm": {"yes"}}
	if code, _, _ := post(t, e.URL+"/s/0/act", form); code != http.StatusBadRequest {
		t.Errorf("an action on a bad id: %d, want 400", code)
	}
	if j, err := e.Broker.Job(ctx, "dead-1"); err != nil || j.State != zclaim.StateDead {
		t.Fatalf("after the refused action: %+v %v", j, err)
	}

	// A producer's plain ZADD of three 1 MB members.
	var zs []redis.Z
	for _, c := range "abc" {
		zs = append(zs, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: strings.Repeat(string(c), 1<<20)})
	}
	if err := e.RDB.ZAdd(ctx, e.Key, zs...).Err(); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, e.URL+"/s/0/scheduled")
	if code != 200 || len(body) > 64<<10 || strings.Count(body, "(1048576 bytes)") != 3 {
		t.Fatalf("a listing of three 1 MB ids: %d, %d bytes\n%.2000s", code, len(body), body)
	}
	if strings.Contains(body, `href="/zclaim/s/0/job?id=aaa`) || strings.Contains(body, `value="aaa`) {
		t.Fatal("a 1 MB id has a link or a checkbox")
	}
}
