package zclaim

// The asynq adapter: what zclaim knows of asynq's own Redis layout (its
// keys, its task hash, its lease timing, its scripts) beyond asynq's
// public API, and where it applies. It holds for the release line
// knownAsynq only, and for the scripts it knows by SHA1: asynqDequeue
// (dequeue.lua, run by middleware_dequeue.go, with the tasks taken ahead
// in middleware_prefetch.go and their holder marks in middleware_held.go)
// and asynqDones (middleware_done.go, done.lua). Under another asynq, or
// another script, each part that needs it is off, and says so
// (adapterOff).

import (
	"context"
	"log/slog"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// knownAsynq is the asynq release line whose Redis layout zclaim reads and
// writes itself: a takeover pass reads the lengths of its queues' active
// lists (busyQueues) and its lease sets, and moves a dead worker's task
// back to pending (requeue); the AsynqClient takes tasks ahead and gives
// them back.
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

// requeue puts the active task id of queue q back at the front of its
// queue in knownAsynq's layout, as asynq's recoverer would move it, but to
// pending, with no retry spent: what a takeover does with the task of a
// dead worker. It reports whether the task was still active (asynq moved
// or finished it otherwise).
func requeue(ctx context.Context, rdb redis.UniversalClient, q, id string) (bool, error) {
	n, err := givebackScript.Run(ctx, rdb,
		[]string{asynqKey(q, "pending"), asynqKey(q, "active"), asynqKey(q, "lease"), heldKey(q)},
		asynqKey(q, "t:"), time.Now().UnixNano(), id).Int64()
	return n > 0, err
}

func newAdapter() adapter {
	v := asynqVersion()
	return adapter{version: v, known: strings.HasPrefix(v, knownAsynq), dequeue: asynqDequeue}
}

// adapterReportsKept is how long zclaim doctor shows a part of the adapter
// that a process found off.
const adapterReportsKept = 24 * time.Hour

// adapterKey is the store's hash of the parts of the adapter its processes
// found off (the report -> when, Unix ms), for zclaim doctor; it expires a
// day after the last report.
func (i *Idempotency) adapterKey() string { return i.opts.Prefix + doneInfix + ":adapter" }

// adapterOff reports, once per process, that a part of the adapter does
// not apply under the asynq in use (what: the part and what follows): at
// Warn, with asynq's version; counted in Stats().AdapterOff
// (zclaim_asynq_adapter_off); and kept in Redis for a day, where
// Broker.Doctor (zclaim doctor) shows it. Everything still runs, by
// asynq's public API or its own scripts, each task at most once; only
// the part named is slower or later.
func (i *Idempotency) adapterOff(ctx context.Context, what string) {
	a := &i.adapter
	if _, dup := a.seen.LoadOrStore(what, true); dup {
		return
	}
	a.off.Add(1)
	v := a.version
	if v == "" {
		v = "of no known version"
	}
	report := "asynq " + v + ": " + what
	i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: a part of the asynq adapter is off", slog.String("asynq", v),
		slog.String("off", what))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_, err := i.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, i.adapterKey(), report, time.Now().UnixMilli())
		p.PExpire(ctx, i.adapterKey(), adapterReportsKept)
		return nil
	})
	if err != nil {
		i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not keep a report of the asynq adapter for zclaim doctor",
			slog.String("error", err.Error()))
	}
}

// AdapterReports returns what the store's processes found off in the
// asynq adapter over the last day, the latest first: each a line naming
// asynq's version and the part (see NewIdempotency).
func (i *Idempotency) AdapterReports(ctx context.Context) ([]string, error) {
	all, err := i.rdb.HGetAll(ctx, i.adapterKey()).Result()
	if err != nil {
		return nil, wrap(ctx, "adapter reports", err, nil)
	}
	since := time.Now().Add(-adapterReportsKept).UnixMilli()
	var r []string
	for report, at := range all {
		if ms, _ := strconv.ParseInt(at, 10, 64); ms >= since {
			r = append(r, report)
		}
	}
	slices.SortFunc(r, func(a, b string) int { return strings.Compare(all[b], all[a]) })
	return r, nil
}

// looksLikeDequeue tells a call of asynq's dequeue script by its keys and
// arguments (the queue's pending list, paused flag, active list and lease
// set; the lease deadline and the task key prefix), whatever its SHA1.
func looksLikeDequeue(keys []string, args []any) bool {
	return len(keys) == 4 && len(args) == 2 && strings.HasPrefix(keys[0], "asynq:{") &&
		strings.HasSuffix(keys[0], "}:pending") && strings.HasSuffix(keys[2], "}:active")
}

func (i *Idempotency) asynqRedis() redis.UniversalClient {
	if i.opts.AsynqRedis != nil {
		return i.opts.AsynqRedis
	}
	return i.rdb
}

// asynq's server leases each task it holds for asynqLease and renews the
// leases of all its tasks every asynqBeat (asynq v0.24 and later; both
// fixed in asynq). A lease last renewed more than asynqGone ago belongs to
// a server that missed two renewals: its process is gone (or stalled so
// long that a takeover is due: the middleware's Begin still lets only one
// run of the key go on).
const (
	asynqLease = 30 * time.Second
	asynqBeat  = 5 * time.Second
	asynqGone  = 2*asynqBeat + 2*time.Second
)

// heldKey is queue q's hash of holder marks (task id -> holder), among
// asynq's keys of the queue (asynqKey): in their slot, and within the keys
// that the workers' ACL grants (docs/operations.md).
func heldKey(q string) string { return asynqKey(q, "zclaim:held") }

// asynqDequeue is the SHA1 of asynq v0.26's dequeue script, whose writes
// dequeue.lua makes.
const asynqDequeue = "a8153319360adc71cdc370107f8ab9786f204765"
