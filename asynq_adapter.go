package zclaim

// The asynq adapter: what zclaim knows of asynq's own Redis layout (its
// keys, its task hash) beyond asynq's public API, and where it applies.
// Everything here holds for the release line knownAsynq only; under
// another asynq, each part that needs it is off, and says so (see
// adapterNote).

import (
	"context"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	_ "embed"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// knownAsynq is the asynq release line whose Redis layout zclaim reads and
// writes itself: the bulk writer writes tasks as its Enqueue does (its task
// hash, pending list and message encoding), and a takeover pass reads the
// lengths of its queues' active lists (busyQueues).
const knownAsynq = "v0.26."

// asynqKey is the key of queue q's part in knownAsynq's layout: its
// base.QueueKeyPrefix ("asynq:{q}:") and part ("active", "lease"; "" for
// the prefix itself).
func asynqKey(q, part string) string { return "asynq:{" + q + "}:" + part }

// asynqVersion is the version of asynq built into the program, "" when
// the build does not say (asynq vendored, or replaced by a directory).
func asynqVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/hibiken/asynq" {
				if m.Replace != nil {
					return m.Replace.Version
				}
				return m.Version
			}
		}
	}
	// A test binary lists no modules; the file asynq's code was compiled
	// from names its version (.../github.com/hibiken/asynq@v0.26.0/client.go).
	pc := reflect.ValueOf(asynq.NewClient).Pointer()
	file, _ := runtime.FuncForPC(pc).FileLine(pc)
	if _, after, ok := strings.Cut(file, "github.com/hibiken/asynq@"); ok {
		v, _, _ := strings.Cut(after, "/")
		return v
	}
	return ""
}

var (
	//go:embed lua/giveback.lua
	givebackLua string
	// givebackScript puts active tasks back at the front of their queue
	// (lua/giveback.lua): tasks taken ahead and not asked for, and the
	// tasks of runs taken over.
	givebackScript = redis.NewScript(givebackLua)
)

// requeue puts the active task id of queue q back at the front of its
// queue in knownAsynq's layout, as asynq's recoverer would move it, but to
// pending, with no retry spent: what a takeover does with the task of a
// dead worker. It reports whether the task was still active (asynq moved
// or finished it otherwise).
func requeue(ctx context.Context, rdb redis.UniversalClient, q, id string) (bool, error) {
	n, err := givebackScript.Run(ctx, rdb,
		[]string{asynqKey(q, "pending"), asynqKey(q, "active"), asynqKey(q, "lease"), heldKey(q)},
		asynqKey(q, "t:"), time.Now().UnixNano(), id, "").Int64()
	return n > 0, err
}
