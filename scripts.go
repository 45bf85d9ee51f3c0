package zclaim

// The Lua scripts, each in its own .lua file that opens with its KEYS /
// ARGV / return contract, embedded and wrapped here, once: claim.lua, the
// entry point of the design, beside the Go files, the rest in lua/.

import (
	"context"
	_ "embed"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/history.lua
	historyLua string
	//go:embed lua/prelude.lua
	preludeLua string
	//go:embed claim.lua
	claimLua string
	//go:embed lua/schedule.lua
	scheduleLua string
	//go:embed lua/ack.lua
	ackLua string
	//go:embed lua/part.lua
	partLua string
	//go:embed lua/extend.lua
	extendLua string
	//go:embed lua/retry.lua
	retryLua string
	//go:embed lua/kill.lua
	killLua string
	//go:embed lua/recover.lua
	recoverLua string
	//go:embed lua/finish.lua
	finishLua string
	//go:embed lua/stats.lua
	statsLua string
	//go:embed lua/move.lua
	moveLua string
	//go:embed lua/inspect.lua
	inspectLua string
	//go:embed lua/periodic.lua
	periodicLua string
	//go:embed lua/dead.lua
	deadLua string

	claimScript    = newScript(claimLua)
	scheduleScript = newScript(scheduleLua)
	ackScript      = newScript(ackLua)
	partScript     = newScript(partLua)
	extendScript   = newScript(extendLua)
	retryScript    = newScript(retryLua)
	killScript     = newScript(killLua)
	recoverScript  = newScript(recoverLua)
	finishScript   = newScript(finishLua)
	statsScript    = newScript(statsLua)
	moveScript     = newScript(moveLua)
	inspectScript  = newScript(inspectLua)
	periodicScript = newScript(periodicLua)
	deadScript     = newScript(deadLua)
)

// newScript prepends the shared helpers (history.lua, prelude.lua) to a
// script's body.
func newScript(body string) *redis.Script {
	return redis.NewScript(historyLua + "\n" + preludeLua + "\n" + body)
}

var (
	//go:embed lua/begin.lua
	beginLua string
	//go:embed lua/settle.lua
	settleLua string
	//go:embed lua/complete.lua
	completeLua string
	//go:embed lua/done.lua
	doneLua string
	//go:embed lua/takeover.lua
	takeoverLua string
	//go:embed lua/beat.lua
	beatLua string
	//go:embed lua/sweep.lua
	sweepLua string
	//go:embed lua/marker.lua
	markerLua string

	// Without the broker's prelude: a run record's scripts need none of
	// it, and defining its helpers costs each call. begin.lua,
	// complete.lua and settle.lua are made for each store (storeScript).
	takeoverScript = redis.NewScript(historyLua + takeoverLua)
	beatScript     = redis.NewScript(beatLua)
	sweepScript    = redis.NewScript(sweepLua)
	markerScript   = redis.NewScript(markerLua)
)

// doneScript is done.lua with complete.lua in front of it, as the
// function complete(KEYS, ARGV) that done.lua calls.
func doneScript() string {
	return "local function complete(KEYS, ARGV)\n" + completeLua + "\nend\n" + doneLua
}

// storeScript returns the script of body with a store's options written
// into it: lease and retention in ms for LEASE_MS and RETENTION_MS, and
// ttl, the life of a record in ms, for TTL_MS. Redis spends less on a
// constant of the script than on an argument (each one a string made for
// the call), on the path that every run takes; stores with the same
// options share a script.
func storeScript(body string, lease, ttl, retention int64) *redis.Script {
	return redis.NewScript(storeBody(body, lease, ttl, retention))
}

// storeBody is body with a store's options written in, as storeScript,
// after history.lua.
func storeBody(body string, lease, ttl, retention int64) string {
	return historyLua + strings.NewReplacer(
		"LEASE_MS", strconv.FormatInt(lease, 10),
		"TTL_MS", strconv.FormatInt(ttl, 10),
		"RETENTION_MS", strconv.FormatInt(retention, 10)).Replace(body)
}

// eachShard runs script s, a read, on every shard of the schedule, with
// the keys and arguments args gives for each, in one pipeline: one round
// trip per node. It returns each shard's reply, by shard.
func (b *shardSet) eachShard(ctx context.Context, s *redis.Script, args func(k *keys) ([]string, []any)) []*redis.Cmd {
	return b.pipelined(ctx, s, b.shards, args)
}

// writeShards runs script s, a write, on shards: in one pipeline, or shard
// by shard where writes wait for replicas (WAIT counts the writes of its
// own connection, on each shard's node). It returns the replies in the
// shards' order.
func (b *shardSet) writeShards(ctx context.Context, s *redis.Script, shards []*keys,
	args func(k *keys) ([]string, []any)) []*redis.Cmd {
	if len(shards) > 1 && b.repl.n == 0 {
		return b.pipelined(ctx, s, shards, args)
	}
	cmds := make([]*redis.Cmd, len(shards))
	for i, k := range shards {
		keys, a := args(k)
		cmds[i] = b.repl.run(ctx, b.rdb, s, keys, a...)
	}
	return cmds
}

// pipelined sends s to each of shards in one pipeline (pipelinedScripts).
func (b *shardSet) pipelined(ctx context.Context, s *redis.Script, shards []*keys,
	args func(k *keys) ([]string, []any)) []*redis.Cmd {
	return pipelinedScripts(ctx, b.rdb, len(shards), func(i int) (*redis.Script, []string, []any) {
		keys, a := args(shards[i])
		return s, keys, a
	})
}

// neverRan gives the commands of a pipeline that never ran (its
// connection could not be made or authenticated: WRONGPASS, NOAUTH), which
// are left without a reply or an error, the pipeline's error perr.
func neverRan(perr error, cmds ...*redis.Cmd) {
	for _, c := range cmds {
		if perr != nil && c.Err() == nil && c.Val() == nil {
			c.SetErr(perr)
		}
	}
}

// pipelinedScripts sends n script calls in one pipeline, call(i) naming
// the i-th's script, keys and arguments, and returns their replies in
// order. A call refused before it ran (NOSCRIPT: the node lacks the
// script; or retryable) is sent again, alone, with the script's body.
func pipelinedScripts(ctx context.Context, rdb redis.UniversalClient, n int,
	call func(i int) (*redis.Script, []string, []any)) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	_, perr := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			s, keys, a := call(i)
			cmds[i] = s.EvalSha(ctx, p, keys, a...)
		}
		return nil
	})
	neverRan(perr, cmds...)
	for i := range cmds {
		if err := cmds[i].Err(); redis.HasErrorPrefix(err, "NOSCRIPT") || retryable(err) {
			s, keys, a := call(i)
			cmds[i] = replication{}.run(ctx, rdb, s, keys, a...)
		}
	}
	return cmds
}
