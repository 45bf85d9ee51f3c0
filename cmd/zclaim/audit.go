package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// auditSample is how many members audit reads, spread over the set.
const auditSample = 200

// audit is what `zclaim audit` found in a sorted set.
type audit struct {
	Key          string
	Type         string   // the key's Redis type ("none" when it does not exist)
	Members      int64    // ZCARD
	Unit         string   // "s", "s with fractions", "ms", "µs" or "not a time"
	Earliest     string   // the lowest score, as Redis gives it
	Latest       string   // the highest
	Due          int64    // members due now (scores at or before the server's now, in Unit)
	OldestDue    float64  // seconds the earliest due member has waited
	Payloads     int      // of the sampled members, those that look like payloads (JSON, long, spaces)
	Sampled      int      // members sampled
	Examples     []string `json:",omitempty"` // a few sampled members, cut short
	ZclaimKeys   []string `json:",omitempty"` // zclaim keys of this schedule that exist already
	Fits         []string // what zclaim options fit it
	ServerTimeMs int64
}

// cmdAudit reads an existing sorted set without writing anything and
// says what it holds and which zclaim options fit it.
func cmdAudit(ctx context.Context, c *cli, args []string) int {
	if len(args) > 0 {
		fmt.Fprintln(c.errw, "usage: zclaim audit --key KEY")
		return exitUsage
	}
	a, err := runAudit(ctx, c.rdb, c.key)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(a)
	} else {
		rows := [][]string{{"key", a.Key}, {"type", a.Type}}
		if a.Type == "zset" {
			rows = append(rows,
				[]string{"members", strconv.FormatInt(a.Members, 10)},
				[]string{"score unit", a.Unit},
				[]string{"scores", a.Earliest + " … " + a.Latest},
			)
			if a.Unit != "not a time" {
				rows = append(rows, []string{"due now", strconv.FormatInt(a.Due, 10)},
					[]string{"oldest due",
						(time.Duration(a.OldestDue * float64(time.Second))).Round(time.Millisecond).String()})
			}
			rows = append(rows, []string{"payload members", fmt.Sprintf("%d of %d sampled", a.Payloads, a.Sampled)})
			for _, e := range a.Examples {
				rows = append(rows, []string{"example", e})
			}
			if len(a.ZclaimKeys) > 0 {
				rows = append(rows, []string{"zclaim keys", strings.Join(a.ZclaimKeys, " ")})
			}
		}
		table(c.out, rows)
		fmt.Fprintln(c.out)
		for _, f := range a.Fits {
			fmt.Fprintln(c.out, "- "+f)
		}
	}
	if a.Type != "zset" {
		return exitPartial
	}
	return exitOK
}

func runAudit(ctx context.Context, rdb redis.UniversalClient, key string) (audit, error) {
	a := audit{Key: key}
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		return a, fmt.Errorf("zclaim: audit: %w", err)
	}
	a.Type = typ
	switch typ {
	case "none":
		a.Fits = []string{"the key does not exist: name it in BrokerOptions.Key and zclaim creates it " +
			"(or check --key and --redis)"}
		return a, nil
	case "zset":
	default:
		a.Fits = []string{fmt.Sprintf("the key holds a %s, not a sorted set: zclaim cannot adopt it; give the "+
			"schedule another Key", typ)}
		return a, nil
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return a, fmt.Errorf("zclaim: audit: %w", err)
	}
	a.ServerTimeMs = now.UnixMilli()
	if a.Members, err = rdb.ZCard(ctx, key).Result(); err != nil {
		return a, fmt.Errorf("zclaim: audit: %w", err)
	}
	if a.Members == 0 {
		a.Unit = "not a time"
		a.Fits = []string{"the set is empty: any ScoreUnit fits; producers that write Unix seconds need none set"}
		return a, nil
	}
	// A sample spread over the set by rank, and its ends.
	p := rdb.Pipeline()
	step := max(a.Members/auditSample, 1)
	var cmds []*redis.ZSliceCmd
	for r := int64(0); r < a.Members && len(cmds) < auditSample; r += step {
		cmds = append(cmds, p.ZRangeWithScores(ctx, key, r, r))
	}
	last := p.ZRangeWithScores(ctx, key, -1, -1)
	if _, err := p.Exec(ctx); err != nil {
		return a, fmt.Errorf("zclaim: audit: %w", err)
	}
	var scores []float64
	var members []string
	for _, c := range cmds {
		if z := c.Val(); len(z) == 1 {
			scores = append(scores, z[0].Score)
			members = append(members, fmt.Sprint(z[0].Member))
		}
	}
	lo := scores[0]
	hi := lo
	if z := last.Val(); len(z) == 1 {
		hi = z[0].Score
	}
	a.Earliest, a.Latest = fmtScore(lo), fmtScore(hi)
	a.Unit = scoreUnit(scores, now)
	var nowUnits float64
	switch a.Unit {
	case "s", "s with fractions":
		nowUnits = float64(now.UnixMicro()) / 1e6
	case "ms":
		nowUnits = float64(now.UnixMicro()) / 1e3
	case "µs":
		nowUnits = float64(now.UnixMicro())
	}
	if a.Unit != "not a time" {
		a.Due, _ = rdb.ZCount(ctx, key, "-inf", strconv.FormatFloat(nowUnits, 'f', -1, 64)).Result()
		if a.Due > 0 {
			perSec := map[string]float64{"s": 1, "s with fractions": 1, "ms": 1e3, "µs": 1e6}[a.Unit]
			a.OldestDue = (nowUnits - lo) / perSec
		}
	}
	a.Sampled = len(members)
	for _, m := range members {
		if looksLikePayload(m) {
			a.Payloads++
			if len(a.Examples) < 3 {
				a.Examples = append(a.Examples, cut(m, 60))
			}
		}
	}
	if len(a.Examples) == 0 {
		for _, m := range members[:min(3, len(members))] {
			a.Examples = append(a.Examples, cut(m, 60))
		}
	}
	// zclaim's own keys of this schedule, if it was adopted already.
	base := key
	if s := strings.IndexByte(key, '{'); s < 0 || !strings.Contains(key[s:], "}") {
		base = "{" + key + "}"
	}
	for _, k := range []string{":jobs", ":inflight", ":dead", ":tokens"} {
		if n, _ := rdb.Exists(ctx, base+k).Result(); n == 1 {
			a.ZclaimKeys = append(a.ZclaimKeys, base+k)
		}
	}
	a.Fits = fits(a)
	return a, nil
}

// scoreUnit guesses the unit of scores from their size, against the
// server's now: Unix seconds are about 1.7e9 today, milliseconds 1.7e12.
func scoreUnit(scores []float64, now time.Time) string {
	var n, frac, sec, milli, micro int
	nowS := float64(now.Unix())
	for _, s := range scores {
		n++
		switch {
		case s > nowS/10 && s < nowS*10:
			sec++
			if s != math.Trunc(s) {
				frac++
			}
		case s > nowS*100 && s < nowS*1e4:
			milli++
		case s > nowS*1e5 && s < nowS*1e7:
			micro++
		}
	}
	switch {
	case sec*10 >= n*9 && frac > 0:
		return "s with fractions"
	case sec*10 >= n*9:
		return "s"
	case milli*10 >= n*9:
		return "ms"
	case micro*10 >= n*9:
		return "µs"
	}
	return "not a time"
}

func looksLikePayload(m string) bool {
	t := strings.TrimSpace(m)
	if (strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[")) && json.Valid([]byte(t)) {
		return true
	}
	return len(m) > 128 || strings.ContainsAny(m, " \n\t")
}

func fits(a audit) []string {
	var out []string
	switch a.Unit {
	case "s":
		out = append(out,
			"scores are Unix seconds: the default ScoreUnit (time.Second) fits; zclaim writes new jobs "+
				"with millisecond fractions")
	case "s with fractions":
		out = append(out, "scores are Unix seconds with fractions: the default ScoreUnit (time.Second) fits")
	case "ms":
		out = append(out,
			"scores are Unix milliseconds: set BrokerOptions.ScoreUnit to time.Millisecond (and "+
				"--unit ms for this command)")
	case "µs":
		out = append(out,
			"scores look like Unix microseconds, which zclaim does not read: have producers write seconds "+
				"or milliseconds to a new key")
	default:
		out = append(out,
			"scores are not Unix times in s or ms (priorities? counters?): this set is not a "+
				"delay queue zclaim can adopt")
	}
	switch {
	case a.Payloads == 0:
		out = append(out,
			fmt.Sprintf("members look like job ids: adopt the set as it is (BrokerOptions{Key: %q}); "+
				"producers keep their ZADD", a.Key),
			"plain ZADD members carry no task type: set DispatcherOptions.DefaultType to the "+
				"asynq task type they become")
	case a.Payloads*2 >= a.Sampled:
		out = append(out,
			"members are payloads, not ids: zclaim's job id is the member, so each distinct "+
				"payload becomes its own job; "+
				"see docs/migrating.md (a set of JSON payloads) to move producers to Broker.Schedule "+
				"with an id and the payload")
	default:
		out = append(out,
			fmt.Sprintf("%d of %d sampled members look like payloads: check what producers write before adopting "+
				"the set", a.Payloads, a.Sampled))
	}
	if a.Due > 0 {
		out = append(out,
			fmt.Sprintf("%d members are due now (oldest %s): a dispatcher started on this set dispatches them at once",
				a.Due, time.Duration(a.OldestDue*float64(time.Second)).Round(time.Second)))
	}
	if len(a.ZclaimKeys) > 0 {
		out = append(out, "zclaim keys of this schedule exist already: it has been adopted")
	}
	return out
}

func fmtScore(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
