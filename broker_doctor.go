package zclaim

// What a schedule needs from its server, checked on demand (zclaim doctor).

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/redisinfo"
)

// DoctorOptions tune Broker.Doctor. The zero value is valid.
type DoctorOptions struct {
	// DefaultType is the dispatchers' DispatcherOptions.DefaultType, which
	// the check of members without a type names. Default: "".
	DefaultType string
	// NoDefaultType says the dispatchers have no DefaultType: members
	// without a type (a plain ZADD's) go to the dead set when due, and are
	// a problem. Default: false (they are reported, as the type a
	// dispatcher's DefaultType gives them, and are no problem).
	NoDefaultType bool
	// MaxClockSkew is how far the server's clock may be from this
	// machine's before it is a problem: RunAt times come from the
	// producers' clocks, claims go by Redis' clock, so a skew makes jobs
	// run that much early or late. Default: DefaultMaxClockSkew (500ms).
	MaxClockSkew time.Duration
	// Store is the idempotency store whose processes' reports of the asynq
	// adapter the check "asynq adapter" reads (Idempotency.AdapterReports).
	// Default: the Broker's Runs; with neither, the check does not run.
	Store *Idempotency
}

// DefaultMaxClockSkew is DoctorOptions.MaxClockSkew when it is zero.
const DefaultMaxClockSkew = 500 * time.Millisecond

// Problem is something Broker.Doctor found wrong, with its fix.
type Problem struct {
	Check  string // "version", "eviction", "persistence", "clock", "key types", "typeless members" or "asynq adapter"
	Detail string // what is wrong
	Fix    string // what to do about it
}

// Checked is one check that Broker.Doctor ran, and what it found.
type Checked struct {
	Check  string
	Result string   // what the server said, for people
	Issue  *Problem // nil when the check passed
}

// doctorNow is the local clock the clock check compares with (a variable
// for the tests).
var doctorNow = time.Now

// Doctor checks what the schedule needs from the server that holds it:
// Redis 7 or newer, an eviction policy that keeps keys (noeviction),
// persistence (AOF or RDB save points), a clock within MaxClockSkew of
// this machine's, keys of the right Redis types, and (with NoDefaultType)
// no members without a task type. It returns every check it ran;
// a check that could not run (an ACL without CONFIG, say) says so in its
// Result and is not a problem. It fails only when the server cannot be
// asked at all.
func (b *Broker) Doctor(ctx context.Context, opts DoctorOptions) ([]Checked, error) {
	if opts.MaxClockSkew <= 0 {
		opts.MaxClockSkew = DefaultMaxClockSkew
	}
	var out []Checked
	add := func(check, result string, p *Problem) {
		if p != nil {
			p.Check = check
		}
		out = append(out, Checked{Check: check, Result: result, Issue: p})
	}
	// The server checks run on each master that holds a shard (one
	// without Shards), named when there are several.
	var nodes []redis.UniversalClient
	var addrs []string
	seen := map[string]bool{}
	for _, k := range b.shards {
		node, err := serverNode(ctx, b.rdb, k.schedule)
		if err != nil {
			return nil, wrap(ctx, "doctor", err, nil)
		}
		addr := ""
		if c, ok := node.(*redis.Client); ok {
			addr = c.Options().Addr
		}
		if !seen[addr] {
			seen[addr] = true
			nodes, addrs = append(nodes, node), append(addrs, addr)
		}
	}
	for i, node := range nodes {
		where := ""
		if len(nodes) > 1 {
			where = addrs[i] + ": "
		}
		if err := checkNode(ctx, node, where, opts, add); err != nil {
			return nil, err
		}
	}

	if store := cmp.Or(opts.Store, b.opts.Runs); store != nil {
		reports, err := store.AdapterReports(ctx)
		switch {
		case err != nil:
			add("asynq adapter", "the store's reports could not be read: "+err.Error(), nil)
		case len(reports) == 0:
			add("asynq adapter", "every part applies: no process of the store "+store.Prefix()+" reported one off in the last day", nil)
		default:
			add("asynq adapter", strings.Join(reports, "; "), &Problem{
				Detail: "processes of the store " + store.Prefix() + " run an asynq whose Redis layout or scripts zclaim " +
					"does not know: each task still runs at most once, but the parts named are off",
				Fix: "build with the asynq release zclaim supports (go.mod), or a zclaim release that knows this asynq"})
		}
	}

	pipe := b.rdb.Pipeline()
	want := map[string]string{}
	var names []string
	var cards, hlens []*redis.IntCmd
	for _, sk := range b.shards {
		for k, t := range sk.types {
			want[k] = t
			names = append(names, k)
		}
		cards = append(cards, pipe.ZCard(ctx, sk.schedule))
		hlens = append(hlens, pipe.HLen(ctx, sk.pending))
	}
	slices.Sort(names)
	types := map[string]*redis.StatusCmd{}
	for _, k := range names {
		types[k] = pipe.Type(ctx, k)
	}
	pipe.Exec(ctx) // each command's error is read below
	var wrong []string
	for _, k := range names {
		got, err := types[k].Result()
		if err != nil {
			return nil, wrap(ctx, "doctor", err, nil)
		}
		if got != "none" && got != want[k] {
			wrong = append(wrong, fmt.Sprintf("%s is a %s, not a %s", k, got, want[k]))
		}
	}
	if len(wrong) > 0 {
		add("key types", strings.Join(wrong, "; "), &Problem{
			Detail: "keys of the schedule hold another Redis type: another program uses these names",
			Fix:    "give the schedule another Key, or delete those keys if nothing needs them"})
		return out, nil
	}
	add("key types", fmt.Sprintf("%d keys checked", len(names)), nil)

	var n, typeless int64
	for i := range cards {
		c, _ := cards[i].Result()
		h, _ := hlens[i].Result()
		n += c
		typeless += max(0, c-h)
	}
	switch {
	case typeless == 0:
		add("typeless members", "every scheduled member has a record", nil)
	case opts.DefaultType != "":
		add("typeless members",
			fmt.Sprintf("about %d members without a type become %q tasks", typeless, opts.DefaultType), nil)
	case !opts.NoDefaultType:
		add("typeless members", fmt.Sprintf("about %d of %d scheduled members have no task type: they take the "+
			"dispatchers' DefaultType (without one they go to the dead set when due)", typeless, n), nil)
	default:
		add("typeless members",
			fmt.Sprintf("about %d of %d scheduled members have no task type", typeless, n), &Problem{
				Detail: "members written by another program (a plain ZADD) carry no task type, and with no default they " +
					"go to the dead set when due",
				Fix: "set DispatcherOptions.DefaultType (and pass --default-type to doctor), or schedule them with " +
					"Broker.Schedule and a Type"})
	}
	return out, nil
}

// signed formats d with its sign ("+1.2s", "-300ms").
func signed(d time.Duration) string {
	d = d.Round(100 * time.Microsecond)
	if d >= 0 {
		return "+" + d.String()
	}
	return d.String()
}

// checkNode runs the checks of one server (version, eviction, persistence,
// clock), its results prefixed with where.
func checkNode(ctx context.Context, node redis.UniversalClient, where string, opts DoctorOptions,
	add func(check, result string, p *Problem)) error {
	info, err := node.Info(ctx, "server", "memory", "persistence").Result()
	if err != nil {
		return wrap(ctx, "doctor", err, nil)
	}

	// The check reads redis_version (Valkey's: the Redis it is compatible
	// with); the result names the server by its own name and version.
	version := infoField(info, "redis_version")
	name, own := redisinfo.Server(info)
	server := strings.ToLower(name) + " " + own
	if major, _ := strconv.Atoi(strings.Split(version, ".")[0]); major < 7 {
		add("version", where+server,
			&Problem{Detail: "zclaim needs Redis 7 or newer, the server runs " + version,
				Fix: "upgrade the server to Redis 7"})
	} else {
		add("version", where+server, nil)
	}

	policy := infoField(info, "maxmemory_policy")
	if policy != "" && policy != "noeviction" {
		add("eviction", where+"maxmemory-policy "+policy, &Problem{
			Detail: "under " + policy + " Redis deletes keys when memory runs short, and jobs or run " +
				"records vanish without an error",
			Fix: "CONFIG SET maxmemory-policy noeviction, and set it in redis.conf"})
	} else {
		add("eviction", where+"maxmemory-policy "+policy, nil)
	}

	if infoField(info, "aof_enabled") == "1" {
		add("persistence", where+"appendonly yes", nil)
	} else if save, err := node.ConfigGet(ctx, "save").Result(); err != nil {
		add("persistence", where+"appendonly no; save points unknown (CONFIG GET refused: "+err.Error()+")", nil)
	} else if s := strings.TrimSpace(save["save"]); s == "" {
		add("persistence", where+"appendonly no, no save points", &Problem{
			Detail: "the server persists nothing: a restart loses every job",
			Fix:    "CONFIG SET appendonly yes (appendfsync everysec or always), and set it in redis.conf"})
	} else {
		add("persistence", where+"appendonly no, RDB save points "+strconv.Quote(s), &Problem{
			Detail: "a crash rolls back to the last save: work finished since runs again, and " +
				"jobs scheduled since are lost",
			Fix: "CONFIG SET appendonly yes (appendfsync everysec or always), and set it in redis.conf"})
	}

	t0 := doctorNow()
	srv, err := node.Time(ctx).Result()
	if err != nil {
		return wrap(ctx, "doctor", err, nil)
	}
	rtt := doctorNow().Sub(t0)
	skew := srv.Sub(t0.Add(rtt / 2))
	res := where + fmt.Sprintf("server clock %s from this machine's (round trip %s)", signed(skew),
		rtt.Round(time.Microsecond))
	if math.Abs(float64(skew)) > float64(opts.MaxClockSkew) {
		add("clock", res, &Problem{
			Detail: fmt.Sprintf("the server's clock is %s from this machine's, more than %v: jobs scheduled here "+
				"run that much early or late", signed(skew), opts.MaxClockSkew),
			Fix: "run NTP (chrony, systemd-timesyncd) on the server and on the producers' machines"})
	} else {
		add("clock", res, nil)
	}

	return nil
}
