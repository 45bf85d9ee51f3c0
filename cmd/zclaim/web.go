package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimweb"
)

// passwordEnv names the variable that holds the console's password.
const passwordEnv = "ZCLAIM_WEB_PASSWORD"

var webListen *string
var webReadOnly, webBehindAuth *bool
var webHosts []string

func webFlags(fs *flag.FlagSet) {
	webListen = fs.String("listen", "127.0.0.1:8080", "address to serve the console on")
	webReadOnly = fs.Bool("read-only", false, "show no buttons and refuse every change")
	webBehindAuth = fs.Bool("behind-auth", false, "serve a non-loopback address without a password: "+
		"the console is behind your own authenticating proxy")
	webHosts = nil
	fs.Func("host", "a host name the console answers to besides loopback names and IP addresses, as in "+
		"ops.example.com or https://ops.example.com behind a proxy that ends TLS (repeatable)", func(v string) error {
		webHosts = append(webHosts, v)
		return nil
	})
}

// cmdWeb serves the web console of the schedule (zclaimweb) until
// interrupted. On a loopback address it needs nothing more; on any other
// it needs a password in $ZCLAIM_WEB_PASSWORD (HTTP basic auth, any user
// name) or --behind-auth.
func cmdWeb(ctx context.Context, c *cli, args []string) int {
	if len(args) > 0 {
		fmt.Fprintln(c.errw, "usage: zclaim web [--listen ADDR] [--host NAME]... [--read-only] [--behind-auth]")
		return exitUsage
	}
	password := os.Getenv(passwordEnv)
	host, _, err := net.SplitHostPort(*webListen)
	if err != nil {
		fmt.Fprintf(c.errw, "zclaim web: --listen %q: %v\n", *webListen, err)
		return exitUsage
	}
	if !loopback(host) && password == "" && !*webBehindAuth {
		fmt.Fprintf(c.errw, "zclaim web: --listen %s is not a loopback address: set a password in $%s "+
			"(HTTP basic auth), or pass --behind-auth if a proxy of yours authenticates every request\n",
			*webListen, passwordEnv)
		return exitUsage
	}
	// Refuse to start on a Redis that cannot be used, rather than show
	// its error inside every page.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = c.rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		fmt.Fprintf(c.errw, "zclaim web: cannot use Redis: %v\n", err)
		return exitRedis
	}
	idem, err := c.store()
	if err != nil {
		fmt.Fprintf(c.errw, "%v\n", err)
		return exitUsage
	}
	defer idem.Close()
	insp := asynq.NewInspectorFromRedisClient(c.rdb)
	hosts := webHosts
	if host != "" && net.ParseIP(host) == nil && !loopback(host) {
		hosts = append(hosts, host) // the name it listens on
	}
	h, err := zclaimweb.New(zclaimweb.Options{Schedules: []*zclaim.Broker{c.b}, Idempotency: idem, Inspector: insp,
		ReadOnly: *webReadOnly, Hosts: hosts})
	if err != nil {
		fmt.Fprintf(c.errw, "%v\n", err)
		return exitUsage
	}
	if password != "" {
		h = basicAuth(h, password)
	}
	l, err := net.Listen("tcp", *webListen)
	if err != nil {
		fmt.Fprintf(c.errw, "zclaim web: %v\n", err)
		return exitRedis
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(c.out, "zclaim web: the console of %s is on http://%s/\n", c.key, l.Addr())
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(c.errw, "zclaim web: %v\n", err)
		return exitRedis
	}
	return exitOK
}

// loopback tells whether host (of a listen address) is this machine only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// basicAuth lets through the requests whose basic-auth password is
// password (any user name).
func basicAuth(h http.Handler, password string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="zclaim", charset="UTF-8"`)
			http.Error(w, "zclaim web: a password is needed", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
