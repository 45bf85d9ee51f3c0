package zclaimweb

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// hostRule is one entry of Options.Hosts.
type hostRule struct {
	scheme string // "" for the connection's own
	name   string // lower case; a leading "*." matches any name under it
	port   string // "" for any
}

func parseHosts(hosts []string) ([]hostRule, error) {
	var rules []hostRule
	for _, h := range hosts {
		var r hostRule
		rest := strings.ToLower(strings.TrimSpace(h))
		if s, after, ok := strings.Cut(rest, "://"); ok {
			if s != "http" && s != "https" {
				return nil, fmt.Errorf("%w: Hosts entry %q: the scheme can be http or https only", ErrInvalidOptions, h)
			}
			r.scheme, rest = s, after
		}
		r.name, r.port = splitHostPort(rest)
		name := strings.TrimPrefix(r.name, "*.")
		if name == "" || strings.ContainsAny(name, "/*?#@ ") || rest != joinHostPort(r.name, r.port) {
			return nil, fmt.Errorf("%w: Hosts entry %q is not a host name with an optional port and scheme",
				ErrInvalidOptions, h)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// origin is the console's own origin for r (scheme://host[:port], as a
// browser writes an Origin), and whether r's Host is one the console
// answers to: an IP address (a browser sends one only for a page it
// loaded from that address, so DNS rebinding cannot forge it), a
// loopback name, or one of Options.Hosts.
func (h *handler) origin(r *http.Request) (string, bool) {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	name, port := splitHostPort(strings.ToLower(r.Host))
	if net.ParseIP(name) == nil && strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789.-_") != "" {
		return "", false // not a host name
	}
	ok := name == "localhost" || strings.HasSuffix(name, ".localhost") || net.ParseIP(name) != nil
	for _, rule := range h.hosts {
		if ok {
			break
		}
		if rule.port != "" && rule.port != port {
			continue
		}
		if n, wild := strings.CutPrefix(rule.name, "*."); wild && strings.HasSuffix(name, "."+n) || name == rule.name {
			ok = true
			if rule.scheme != "" && r.TLS == nil {
				scheme = rule.scheme
			}
		}
	}
	if !ok || name == "" || strings.Trim(port, "0123456789") != "" {
		return "", false
	}
	return scheme + "://" + joinHostPort(name, port), true
}

// sameSite tells whether the Origin header o names the origin own, with
// a port left out meaning its scheme's default.
func sameSite(o, own string) bool {
	a, err1 := url.Parse(strings.ToLower(o))
	b, err2 := url.Parse(own)
	if err1 != nil || err2 != nil || a.Scheme != b.Scheme || a.Hostname() != b.Hostname() {
		return false
	}
	return withDefault(a) == withDefault(b)
}

func withDefault(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// splitHostPort splits a Host header's value; the name keeps no brackets.
func splitHostPort(hostport string) (name, port string) {
	if n, p, err := net.SplitHostPort(hostport); err == nil {
		return n, p
	}
	return strings.Trim(hostport, "[]"), ""
}

func joinHostPort(name, port string) string {
	if port == "" {
		if strings.Contains(name, ":") {
			return "[" + name + "]"
		}
		return name
	}
	return net.JoinHostPort(name, port)
}
