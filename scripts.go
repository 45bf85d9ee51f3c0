package zclaim

// The Lua scripts, each in its own .lua file that opens with its KEYS /
// ARGV / return contract, embedded and wrapped here, once.

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed prelude.lua
	preludeLua string
	//go:embed claim.lua
	claimLua string
	//go:embed schedule.lua
	scheduleLua string
	//go:embed ack.lua
	ackLua string
	//go:embed extend.lua
	extendLua string
	//go:embed retry.lua
	retryLua string
	//go:embed kill.lua
	killLua string
	//go:embed recover.lua
	recoverLua string
	//go:embed finish.lua
	finishLua string
	//go:embed stats.lua
	statsLua string
	//go:embed move.lua
	moveLua string
	//go:embed inspect.lua
	inspectLua string
	//go:embed periodic.lua
	periodicLua string
	//go:embed dead.lua
	deadLua string

	claimScript    = newScript(claimLua)
	scheduleScript = newScript(scheduleLua)
	ackScript      = newScript(ackLua)
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

// newScript prepends the shared helpers (prelude.lua) to a script's body.
func newScript(body string) *redis.Script { return redis.NewScript(preludeLua + "\n" + body) }

var (
	//go:embed begin.lua
	beginLua string
	//go:embed settle.lua
	settleLua string

	// Without the broker's prelude: a run record's scripts need none of
	// it, and defining its helpers costs each call.
	beginScript  = redis.NewScript(beginLua)
	settleScript = redis.NewScript(settleLua)
)
