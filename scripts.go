package zclaim

// The Lua scripts, each in its own .lua file that opens with its KEYS /
// ARGV / return contract, embedded and wrapped here, once: claim.lua, the
// entry point of the design, beside the Go files, the rest in lua/.

import (
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

// The scripts that stand in for asynq's own (see asynq_adapter.go).
var (
	//go:embed lua/giveback.lua
	givebackLua string
	//go:embed lua/dequeue.lua
	dequeueLua string
	// givebackScript puts active tasks back at the front of their queue
	// (lua/giveback.lua): tasks taken ahead and not asked for, and the
	// tasks of runs taken over.
	givebackScript = redis.NewScript(givebackLua)
	// dequeueScript is asynq v0.26's dequeue of several tasks, with their
	// holder marks (lua/dequeue.lua).
	dequeueScript = redis.NewScript(dequeueLua)
)
