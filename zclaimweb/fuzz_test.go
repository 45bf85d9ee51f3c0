package zclaimweb

import (
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// Whatever the Host header, the console answers only to an IP address, a
// loopback name or a named host, and never panics; its own origin is one
// that sameSite accepts.
func FuzzHost(f *testing.F) {
	for _, s := range []string{"127.0.0.1:8080", "[::1]:80", "localhost", "a.localhost:1", "ops.example.test",
		"ops.example.test.evil", "evil.test", "", ":", "[", "x:y:z", "OPS.EXAMPLE.TEST:443", "a.b.ops.example.test"} {
		f.Add(s)
	}
	h := &handler{}
	var err error
	if h.hosts, err = parseHosts([]string{"ops.example.test", "*.b.ops.example.test", "https://tls.example.test:8443"}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		own, ok := h.origin(r)
		if !ok {
			return
		}
		name, _ := splitHostPort(strings.ToLower(host))
		named := name == "ops.example.test" || strings.HasSuffix(name, ".b.ops.example.test") || name == "tls.example.test"
		if net.ParseIP(name) == nil && name != "localhost" && !strings.HasSuffix(name, ".localhost") && !named {
			t.Fatalf("Host %q answered, as %s", host, own)
		}
		if !sameSite(own, own) {
			t.Fatalf("Host %q: its own origin %q is not same-site with itself", host, own)
		}
	})
}

// cut keeps a listing's id short and valid UTF-8; badID refuses what
// zclaim cannot look up.
func FuzzCut(f *testing.F) {
	f.Add("order-1", 10)
	f.Add(strings.Repeat("é", 300), 120)
	f.Add("a\xffb", 2)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 1 || n > 1000 {
			return
		}
		c := cut(s, n)
		if !utf8.ValidString(c) && len(s) > n {
			t.Fatalf("cut(%q, %d) = %q: not UTF-8", s, n, c)
		}
		if len(s) > n && len(c) > n+40 {
			t.Fatalf("cut(%q, %d) is %d bytes", s, n, len(c))
		}
		if (badID(s) == "") != (len(s) <= 512 && utf8.ValidString(s)) {
			t.Fatalf("badID(%q) = %q", s, badID(s))
		}
	})
}
