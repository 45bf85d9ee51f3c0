// Command zclaim shows and changes a zclaim schedule in Redis.
//
//	go install github.com/zclaim/zclaim/cmd/zclaim@latest
//	zclaim stats --key delay:jobs
//	zclaim ls scheduled --limit 20
//	zclaim show order-731
//	zclaim doctor
//	zclaim web --listen 127.0.0.1:8080
//
// Every command takes --redis (a redis:// URL; default $REDIS_URL, else
// redis://127.0.0.1:6379), --cluster (the URL names Redis Cluster nodes),
// --key (the schedule key; default zclaim:{default}) and --unit (s or ms:
// the schedule's score unit), before its own arguments. --json prints
// JSON for scripts. Flags may come before or after the arguments; "--"
// ends them (for an id that starts with "-").
//
// Exit codes: 0 done; 1 done, but not everything asked for was there (an
// unknown id, an id not in the state the command acts on, a periodic
// definition that cannot be read here) or doctor found a problem; 2 a
// usage error; 3 Redis could not be used (unreachable, a key of the wrong
// type, a refused command).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// Exit codes.
const (
	exitOK      = 0
	exitPartial = 1
	exitUsage   = 2
	exitRedis   = 3
)

const usage = `usage: zclaim <command> [flags] [args]

commands:
  stats                          counts of the schedule
  ls scheduled|inflight|dead     list jobs, a page at a time (--limit, --after)
  ls running [--all]             list the runs of active asynq tasks: live, abandoned (worker gone), taken over;
                                 --all adds the finished and those not begun
  ls periodic                    list the periodic definitions and their next ticks
  show ID                        where a job is, and what it carries
  cancel ID...                   remove scheduled jobs
  run-now ID...                  make scheduled jobs due at once
  revive ID...|--all             put dead jobs back on the schedule, due at once
  delete-dead ID...|--all        remove dead jobs for good
  watch                          counts and lag, refreshed (--interval, --count)
  doctor                         check what the schedule needs from its server
  audit                          read an existing sorted set (writes nothing): what it holds, what fits it
  web                            serve the web console (--listen, default 127.0.0.1:8080; --read-only; a password
                                 in $ZCLAIM_WEB_PASSWORD or --behind-auth for any non-loopback address)

flags of every command (anywhere; "--" ends them):
  --redis URL   redis:// URL (default $REDIS_URL, else redis://127.0.0.1:6379)
  --cluster     the URL names Redis Cluster nodes
  --key KEY     the schedule key (default zclaim:{default})
  --runs PREFIX the idempotency store's prefix (default zclaim:run:)
  --unit s|ms   the schedule's score unit (default s)
  --json        JSON output

exit codes: 0 done, 1 not all there or doctor found problems, 2 usage, 3 Redis error
`

func main() {
	// go-redis logs each failed dial of its pool to stderr; the command
	// reports the error that ends it, once.
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv("REDIS_URL")))
}

// quietRedis is go-redis' logger, quiet.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// cli is one invocation: its flags, its broker and where it writes.
type cli struct {
	out, errw io.Writer
	fs        *flag.FlagSet
	url       string
	cluster   bool
	key       string
	runs      string
	bopts     zclaim.BrokerOptions // c.b's
	unit      string
	json      bool

	rdb redis.UniversalClient
	b   *zclaim.Broker
}

type command struct {
	run   func(ctx context.Context, c *cli, args []string) int
	flags func(fs *flag.FlagSet) // the command's own flags
	raw   bool                   // needs only the client: writes nothing, not even the Broker's state marker
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"stats":       {run: cmdStats},
		"ls":          {run: cmdList, flags: listFlags},
		"show":        {run: cmdShow},
		"cancel":      {run: byIDs("cancel", "cancelled", "not scheduled")},
		"run-now":     {run: byIDs("run-now", "made due now", "not scheduled")},
		"revive":      {run: byIDs("revive", "revived", "not dead"), flags: allFlag},
		"delete-dead": {run: byIDs("delete-dead", "deleted", "not dead"), flags: allFlag},
		"watch":       {run: cmdWatch, flags: watchFlags},
		"doctor":      {run: cmdDoctor, flags: doctorFlags},
		"audit":       {run: cmdAudit, raw: true},
		"web":         {run: cmdWeb, flags: webFlags},
	}
}

func run(ctx context.Context, args []string, out, errw io.Writer, envURL string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(errw, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	// The command is the first argument that names one: flags may come
	// before it too.
	name := args[0]
	for i, a := range args {
		if _, ok := commands[a]; ok {
			name = a
			args = append([]string{a}, slices.Delete(slices.Clone(args), i, i+1)...)
			break
		}
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(errw, "zclaim: unknown command %q\n\n%s", name, usage)
		return exitUsage
	}
	c := &cli{out: out, errw: errw, fs: flag.NewFlagSet("zclaim "+args[0], flag.ContinueOnError)}
	c.fs.SetOutput(errw)
	if envURL == "" {
		envURL = "redis://127.0.0.1:6379"
	}
	c.fs.StringVar(&c.url, "redis", envURL, "redis:// URL")
	c.fs.BoolVar(&c.cluster, "cluster", false, "the URL names Redis Cluster nodes")
	c.fs.StringVar(&c.key, "key", zclaim.DefaultKey, "the schedule key")
	c.fs.StringVar(&c.runs, "runs", zclaim.DefaultIdempotencyPrefix, "the idempotency store's prefix")
	c.fs.StringVar(&c.unit, "unit", "s", "the schedule's score unit: s or ms")
	c.fs.BoolVar(&c.json, "json", false, "JSON output")
	if cmd.flags != nil {
		cmd.flags(c.fs)
	}
	// Flags may come before, between or after the arguments ("--" ends them).
	var pos []string
	rest := args[1:]
	for {
		if err := c.fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		rest = c.fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args[1:]) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		rest = rest[1:]
	}
	if c.unit != "s" && c.unit != "ms" {
		fmt.Fprintf(errw, "zclaim: --unit must be s or ms, not %q\n", c.unit)
		return exitUsage
	}
	if code := c.connect(cmd.raw); code != exitOK {
		return code
	}
	defer c.rdb.Close()
	return cmd.run(ctx, c, pos)
}

// connect opens the client and the broker. The broker accepts any server
// (AllowEviction) and logs nothing: doctor reports what it would warn about.
func (c *cli) connect(raw bool) int {
	var useTLS bool
	if c.cluster {
		o, err := redis.ParseClusterURL(c.url)
		if err != nil {
			fmt.Fprintf(c.errw, "zclaim: --redis: %s\n", urlError(err))
			return exitUsage
		}
		o.DialerRetries = 1
		if useTLS = o.TLSConfig != nil; useTLS {
			o.Dialer, o.TLSConfig = tlsDialer(o.DialTimeout, o.TLSConfig), nil
		}
		c.rdb = redis.NewClusterClient(o)
	} else {
		o, err := redis.ParseURL(c.url)
		if err != nil {
			fmt.Fprintf(c.errw, "zclaim: --redis: %s\n", urlError(err))
			return exitUsage
		}
		// A server that refuses the connection fails the command at once:
		// one dial a call, not go-redis' five 100 ms apart.
		o.MaxRetries, o.DialerRetries = 1, 1
		if useTLS = o.TLSConfig != nil; useTLS {
			o.Dialer, o.TLSConfig = tlsDialer(o.DialTimeout, o.TLSConfig), nil
		}
		c.rdb = redis.NewClient(o)
	}
	if useTLS {
		// A server that does not speak TLS hangs each handshake until
		// the dial timeout: try one, not one a command.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.rdb.Ping(ctx).Err()
		cancel()
		if err != nil {
			c.rdb.Close()
			fmt.Fprintf(c.errw, "zclaim: %v\n", err)
			return exitRedis
		}
	}
	if raw {
		return exitOK
	}
	unit := time.Second
	if c.unit == "ms" {
		unit = time.Millisecond
	}
	c.bopts = zclaim.BrokerOptions{Key: c.key, ScoreUnit: unit, AllowEviction: true, Logger: slog.New(slog.DiscardHandler)}
	b, err := zclaim.NewBroker(c.rdb, c.bopts)
	if err != nil {
		c.rdb.Close()
		fmt.Fprintf(c.errw, "%v\n", err)
		return exitUsage
	}
	c.b = b
	return exitOK
}

// tlsDialer dials with TLS and finishes the handshake within timeout (5 s
// when 0), so that a rediss:// URL that names a server without TLS fails
// at once with a message that says so, not after every read timeout.
func tlsDialer(timeout time.Duration, cfg *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, err := (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, fmt.Errorf("TLS handshake with %s failed (a rediss:// URL needs a server that speaks TLS "+
				"on that port; use redis:// for one that does not): %w", addr, err)
		}
		return conn, nil
	}
}

// quoted matches what a URL parse error quotes: the URL, or a part of it
// (a port, an escape), any of which may hold a password.
var quoted = regexp.MustCompile(`"[^"]*"`)

// urlError tells what is wrong with a --redis URL without repeating any of
// it: it may hold a password.
func urlError(err error) string {
	hidden := quoted.ReplaceAllString(err.Error(), `"…"`)
	return "not a valid redis:// URL (" + hidden + "); the URL is not shown: it may hold a password"
}

// store returns the idempotency store of --runs, for reading its runs: it
// takes no part in takeovers and logs nothing.
func (c *cli) store() (*zclaim.Idempotency, error) {
	return zclaim.NewIdempotency(c.rdb,
		zclaim.IdempotencyOptions{Prefix: c.runs, AllowEviction: true, DisableTakeover: true,
			Logger: slog.New(slog.DiscardHandler)})
}

// fail reports a Redis error and returns its exit code.
func (c *cli) fail(err error) int {
	fmt.Fprintf(c.errw, "%v\n", err)
	if errors.Is(err, zclaim.ErrInvalidArgument) {
		return exitUsage
	}
	return exitRedis
}

func (c *cli) printJSON(v any) {
	e := json.NewEncoder(c.out)
	e.SetIndent("", "  ")
	e.Encode(v)
}

// when formats a time for a table: UTC to the millisecond, and how far
// from now.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now).Round(time.Millisecond)
	rel := "in " + d.String()
	if d < 0 {
		rel = (-d).String() + " ago"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z") + " (" + rel + ")"
}

// table writes rows in aligned columns.
func table(w io.Writer, rows [][]string) {
	width := map[int]int{}
	for _, r := range rows {
		for i, cell := range r {
			width[i] = max(width[i], len(cell))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, cell := range r {
			if i == len(r)-1 {
				b.WriteString(cell)
				break
			}
			b.WriteString(cell + strings.Repeat(" ", width[i]-len(cell)+2))
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
