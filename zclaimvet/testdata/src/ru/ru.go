// Package ru polls through rueidis: commands from the client's builder, sent with Do and DoMulti. // want package:"uses github.com/redis/rueidis"
package ru

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
)

var ctx = context.Background()

func run(string) {}

// A read, then a ZREM whose error alone is tested: racy.
func dequeue(c rueidis.Client, key string, now int64) (string, error) {
	ids, err := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("0").Max(strconv.FormatInt(now, 10)).Limit(0, 1).Build()).AsStrSlice() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at ru\.go:\d+`
	if err != nil || len(ids) == 0 {
		return "", err
	}
	if err := c.Do(ctx, c.B().Zrem().Key(key).Member(ids[0]).Build()).Error(); err != nil {
		return "", err
	}
	return ids[0], nil
}

// The command built into a local first; the ZREM's reply kept, its error
// tested, then its count: a check.
func dequeueChecked(c rueidis.Client, key string) (string, error) {
	rangeCmd := c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Limit(0, 1).Build()
	items, err := c.Do(ctx, rangeCmd).AsStrSlice() // want `checked ZREM`
	if err != nil || len(items) == 0 {
		return "", err
	}
	remResp := c.Do(ctx, c.B().Zrem().Key(key).Member(items[0]).Build())
	if remResp.Error() != nil {
		return "", remResp.Error()
	}
	n, err := remResp.AsInt64()
	if err != nil || n == 0 {
		return "", err
	}
	return items[0], nil
}

// Its twin tests the reply's error only: racy.
func dequeueErrorOnly(c rueidis.Client, key string) (string, error) {
	items, err := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Limit(0, 1).Build()).AsStrSlice() // want `racy poller`
	if err != nil || len(items) == 0 {
		return "", err
	}
	remResp := c.Do(ctx, c.B().Zrem().Key(key).Member(items[0]).Build())
	if remResp.Error() != nil {
		return "", remResp.Error()
	}
	return items[0], nil
}

// ZRANGE BYSCORE, then a ZREMRANGEBYSCORE in a pipeline: racy.
func pipelined(c rueidis.Client) {
	items, _ := c.Do(ctx, c.B().Zrange().Key("delay").Min("-inf").Max("100").Byscore().Build()).AsStrSlice() // want `racy poller: ZRANGE BYSCORE reads due members of "delay"`
	for _, it := range items {
		run(it)
	}
	c.DoMulti(ctx, c.B().Zremrangebyscore().Key("delay").Min("-inf").Max("100").Build(), c.B().Del().Key("x").Build())
}

// Commands gathered in a slice, then sent with DoMulti: a pipeline, racy;
// its twin gathers MULTI, the read, the removal and EXEC: one transaction.
func sliced(c rueidis.Client, key string) {
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at ru\.go:\d+`
	cmds := make(rueidis.Commands, 0, len(ids))
	for _, id := range ids {
		run(id)
		cmds = append(cmds, c.B().Zrem().Key(key).Member(id).Build())
	}
	c.DoMulti(ctx, cmds...)
}

func slicedMulti(c rueidis.Client) {
	cmds := rueidis.Commands{c.B().Multi().Build()}
	cmds = append(cmds, c.B().Zrangebyscore().Key("delay").Min("-inf").Max("100").Build(),
		c.B().Zremrangebyscore().Key("delay").Min("-inf").Max("100").Build())
	cmds = append(cmds, c.B().Exec().Build())
	c.DoMulti(ctx, cmds...)
}

// ZREMs of one member each, sent together with DoMulti, whose counts are
// tested among its replies: checks. Their twin tests the replies' errors
// only: racy.
func multiChecked(c rueidis.Client, key string) {
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `checked ZREM at ru\.go:\d+ after ZRANGEBYSCORE on key`
	cmds := make(rueidis.Commands, 0, len(ids))
	for _, id := range ids {
		cmds = append(cmds, c.B().Zrem().Key(key).Member(id).Build())
	}
	for i, r := range c.DoMulti(ctx, cmds...) {
		if n, err := r.AsInt64(); err == nil && n == 1 {
			run(ids[i])
		}
	}
}

func multiCheckedKept(c rueidis.Client, key string) {
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Limit(0, 2).Build()).AsStrSlice() // want `checked ZREM`
	if len(ids) < 2 {
		return
	}
	resps := c.DoMulti(ctx, c.B().Zrem().Key(key).Member(ids[0]).Build(), c.B().Zrem().Key(key).Member(ids[1]).Build())
	for i := range resps {
		if n, _ := resps[i].AsInt64(); n == 1 {
			run(ids[i])
		}
	}
}

func multiErrorsOnly(c rueidis.Client, key string) {
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller`
	cmds := make(rueidis.Commands, 0, len(ids))
	for _, id := range ids {
		cmds = append(cmds, c.B().Zrem().Key(key).Member(id).Build())
	}
	resps := c.DoMulti(ctx, cmds...)
	if len(resps) == 0 {
		return
	}
	for i, r := range resps {
		if r.Error() == nil {
			run(ids[i])
		}
	}
}

// Not reported: the read and the removal in one MULTI/EXEC; a ZREM after
// a SET NX of the id (its read is summarized for callers); a read whose
// members are thrown away (its removal is).
func inMulti(c rueidis.Client) {
	c.DoMulti(ctx,
		c.B().Multi().Build(),
		c.B().Zrangebyscore().Key("delay").Min("-inf").Max("100").Build(),
		c.B().Zremrangebyscore().Key("delay").Min("-inf").Max("100").Build(),
		c.B().Exec().Build())
}

func setNX(c rueidis.Client, key string) { // want setNX:`read ⟨p1⟩`
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice()
	for _, id := range ids {
		if c.Do(ctx, c.B().Set().Key("lock:"+id).Value("1").Nx().Build()).Error() != nil {
			continue
		}
		run(id)
		c.Do(ctx, c.B().Zrem().Key(key).Member(id).Build())
	}
}

func thrownAway(c rueidis.Client, key string) error { // want thrownAway:`rm ⟨p1⟩`
	if err := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("0").Max("100").Build()).Error(); err != nil {
		return err
	}
	return c.Do(ctx, c.B().Zremrangebyscore().Key(key).Min("0").Max("100").Build()).Error()
}

// On a dedicated connection: a poll is racy as anywhere else; its twin
// WATCHes the key first, and its removal in MULTI/EXEC fails if another
// worker changed the key since: an optimistic transaction.
func dedicated(c rueidis.Client, key string) error {
	return c.Dedicated(func(d rueidis.DedicatedClient) error {
		ids, err := d.Do(ctx, d.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at ru\.go:\d+`
		if err != nil || len(ids) == 0 {
			return err
		}
		d.DoMulti(ctx, d.B().Zrem().Key(key).Member(ids...).Build())
		for _, id := range ids {
			run(id)
		}
		return nil
	})
}

func dedicatedWatch(c rueidis.Client, key string) error {
	return c.Dedicated(func(d rueidis.DedicatedClient) error {
		d.Do(ctx, d.B().Watch().Key(key).Build())
		ids, err := d.Do(ctx, d.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice()
		if err != nil || len(ids) == 0 {
			return err
		}
		d.DoMulti(ctx, d.B().Multi().Build(), d.B().Zrem().Key(key).Member(ids...).Build(), d.B().Exec().Build())
		return nil
	})
}

// rueidiscompat, rueidis' go-redis-like adapter: read as go-redis.
func compat(c rueidiscompat.Compat) {
	for _, id := range c.ZRangeByScore(ctx, "delay", rueidiscompat.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		run(id)
		c.ZRem(ctx, "delay", id)
	}
}

// The adapter's commands are judged by their names, as go-redis' are: a
// push of each member acts on it.
func compatPushed(c rueidiscompat.Compat) {
	ids := c.ZRangeByScore(ctx, "delay", rueidiscompat.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		c.ZRem(ctx, "delay", id)
		c.LPush(ctx, "ready", id)
	}
}

func compatDo(c rueidiscompat.Compat, ids []string) {
	c.Do(ctx, "ZRANGEBYSCORE", "delay", "-inf", "100") // want `racy poller`
	c.Do(ctx, "ZREM", "delay", ids[0])
}

// An expiry sweep of an index: the members read are keys, read with MGET
// and deleted with their entries in this index and in another one named
// from their values, in one pipeline. Nothing leaves Redis, so two sweeps
// run nothing twice between them. Its twins act: one pushes each key to a
// list, one runs each value read, one names the other index through a
// function that logs.
func sweepIndex(c rueidis.Client, key string, cutoff int64) (int64, error) {
	var removed int64
	keys, err := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max(strconv.FormatInt(cutoff, 10)).Limit(0, 100).Build()).AsStrSlice()
	if err != nil {
		return removed, err
	}
	if len(keys) == 0 {
		return 0, nil
	}
	values, err := c.Do(ctx, c.B().Mget().Key(keys...).Build()).ToArray()
	if err != nil {
		return removed, err
	}
	cmds := make(rueidis.Commands, 0, len(keys)*3)
	for i, k := range keys {
		cmds = append(cmds, c.B().Del().Key(k).Build(), c.B().Zrem().Key(key).Member(k).Build())
		raw, err := values[i].ToString()
		if err == nil && raw != "" {
			var v struct{ Trace string }
			if json.Unmarshal([]byte(raw), &v) == nil {
				cmds = append(cmds, c.B().Zrem().Key(traceKey(v.Trace)).Member(k).Build())
			}
		}
		removed++
	}
	for _, resp := range c.DoMulti(ctx, cmds...) {
		if err := resp.Error(); err != nil {
			return removed, err
		}
	}
	return removed, nil
}

func traceKey(id string) string { return "trace:" + id }

func sweepPushed(c rueidis.Client, key string) {
	keys, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller`
	cmds := make(rueidis.Commands, 0, len(keys)*2)
	for _, k := range keys {
		cmds = append(cmds, c.B().Zrem().Key(key).Member(k).Build(), c.B().Lpush().Key("ready").Element(k).Build())
	}
	c.DoMulti(ctx, cmds...)
}

func sweepRunsValues(c rueidis.Client, key string) {
	keys, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller`
	values, _ := c.Do(ctx, c.B().Mget().Key(keys...).Build()).ToArray()
	c.Do(ctx, c.B().Zrem().Key(key).Member(keys...).Build())
	for _, v := range values {
		raw, _ := v.ToString()
		run(raw)
	}
}

func sweepKeptKey(c rueidis.Client, key string) {
	keys, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller`
	cmds := make(rueidis.Commands, 0, len(keys))
	for _, k := range keys {
		cmds = append(cmds, c.B().Zrem().Key(key).Member(k).Build(), c.B().Del().Key(keptKey(k)).Build())
	}
	c.DoMulti(ctx, cmds...)
}

// A script run for each member may write anything: it acts.
var markDone = rueidis.NewLuaScript(`redis.call("LPUSH", "done", KEYS[1])`)

func sweepScripted(c rueidis.Client, key string) {
	keys, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller`
	for _, k := range keys {
		c.Do(ctx, c.B().Zrem().Key(key).Member(k).Build())
		markDone.Exec(ctx, c, []string{k}, nil)
	}
}

func keptKey(member string) string {
	kept = append(kept, member)
	return "job:" + member
}

var kept []string

// A periodic job moved to its next time by ZADD: racy; with NX, which
// only adds, no move.
func cron(c rueidis.Client, key string) {
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZADD at ru\.go:\d+ moves them to a later score`
	for _, id := range ids {
		run(id)
		c.Do(ctx, c.B().Zadd().Key(key).ScoreMember().ScoreMember(200, id).Build())
	}
}

func cronNX(c rueidis.Client, key string) { // want cronNX:`read ⟨p1⟩`
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice()
	for _, id := range ids {
		run(id)
		c.Do(ctx, c.B().Zadd().Key(key).Nx().ScoreMember().ScoreMember(200, id).Build())
	}
}

// A lock per member, SET NX and DEL from the builder, let go after the
// removal: racy.
func lockEach(c rueidis.Client, key string) {
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller with a lock per job: ZRANGEBYSCORE reads due members of key, the SET NX at ru\.go:\d+ locks one, and ZREM at ru\.go:\d+ removes it, but the lock is let go at ru\.go:\d+`
	for _, id := range ids {
		if c.Do(ctx, c.B().Set().Key("lock:"+id).Value("1").Nx().Build()).Error() != nil {
			continue
		}
		run(id)
		c.Do(ctx, c.B().Zrem().Key(key).Member(id).Build())
		c.Do(ctx, c.B().Del().Key("lock:"+id).Build())
	}
}
