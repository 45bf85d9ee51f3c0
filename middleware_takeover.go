package zclaim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// takeoverInterval is how often a pass looks for abandoned runs: a quarter
// of the lease, from 100ms to 1s.
func takeoverInterval(lease time.Duration) time.Duration {
	return min(max(lease/4, 100*time.Millisecond), time.Second)
}

// startTakeover starts the loop, once.
func (tk *takeover) startTakeover() {
	i := tk.i
	if i.opts.DisableTakeover || !i.adapter.known { // no takeover without asynq's keys: NewIdempotency said so
		return
	}
	tk.once.Do(func() {
		tk.stop, tk.done = make(chan struct{}), make(chan struct{})
		tk.in = asynq.NewInspectorFromRedisClient(i.asynqRedis())
		go i.takeover.takeoverLoop()
	})
}

// Close sends the Completes held back for asynq's done (see AsynqClient),
// and stops the store's takeover loop, if it runs, and waits for it. The
// store's calls keep working; a middleware handling tasks after Close takes
// no part in takeovers. It never closes the Redis clients it was given.
func (i *Idempotency) Close() error {
	i.flushLate()
	i.ahead.flushAhead()
	i.held.stopHolder()
	tk := &i.takeover
	tk.once.Do(func() {}) // no loop starts after Close
	tk.mu.Lock()
	if tk.stop == nil || tk.stopped {
		tk.stopped = true
		tk.mu.Unlock()
		return nil
	}
	tk.stopped = true
	close(tk.stop)
	tk.mu.Unlock()
	<-tk.done
	return nil
}

func (tk *takeover) takeoverLoop() {
	i := tk.i
	defer close(tk.done)
	every := takeoverInterval(i.opts.Lease)
	for {
		// ±10% so that many processes do not look at the same moment.
		d := every - every/10 + rand.N(every/5+1)
		select {
		case <-tk.stop:
			return
		case <-time.After(d):
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(every, time.Second))
		if i.takeover.passTurn(ctx, every) {
			tk.passes.Add(1)
			// At Warn, once per cause per claimWarnEvery: while passes
			// fail, no dead worker's run is taken over.
			if _, err := i.takeover.takeoverPass(ctx); err != nil && !errors.Is(err, context.Canceled) {
				tk.warn.warn(ctx, i.log, err.Error(), "zclaim: takeover pass failed", slog.String("error", err.Error()))
			}
		}
		cancel()
	}
}

// passTurn reports whether this process makes the pass now. Processes that
// would look at the same tasks the same way (passKey) share their passes:
// the first whose SET NX of their pass key takes it looks, and the key lives
// 4/5 of the interval, so they make about one pass an interval between them
// rather than one each, each of which reads every active task and its run
// record. A Redis error lets the pass go ahead (it meets the same error, or
// finds Redis back).
func (tk *takeover) passTurn(ctx context.Context, every time.Duration) bool {
	i := tk.i
	ok, err := i.rdb.SetNX(ctx, i.takeover.passKey(), "1", every*4/5).Result()
	return ok || err != nil
}

// passKey names the processes that share passes: those of one store
// prefix whose passes read the same queues (TakeoverQueues) and take over
// the same task types (those their middleware handled, and how their Key
// function tells keys). It is one of the store's own keys (doneInfix).
func (tk *takeover) passKey() string {
	i := tk.i
	h := fnv.New64a()
	for _, q := range slices.Sorted(slices.Values(i.opts.TakeoverQueues)) {
		h.Write([]byte(q + "\x00"))
	}
	var types []string
	i.types.Range(func(t, sure any) bool {
		types = append(types, fmt.Sprintf("\x01%s=%v", t, sure))
		return true
	})
	slices.Sort(types)
	for _, t := range types {
		h.Write([]byte(t))
	}
	return i.opts.Prefix + doneInfix + ":pass:" + strconv.FormatUint(h.Sum64(), 16)
}

// takeoverPass looks once at the active tasks of the queues, takes over
// each whose run record says its lease ran out (its worker is gone), and
// puts its task back on its queue (takeOver). It returns how many it took over, and the
// first error it met: a queue it could not list, a run record it could not
// read (of another type, or not one of the middleware's), a takeover Redis
// refused. A task it met such an error on is left as it is.
func (tk *takeover) takeoverPass(ctx context.Context) (int, error) {
	i := tk.i
	runs, err := i.takeover.activeRuns(ctx, i.takeover.in)
	// The busy queues' stale holder marks go: marks name active tasks.
	queues := map[string]bool{}
	for _, r := range runs {
		queues[r.task.Queue] = true
	}
	i.held.sweepMarks(ctx, slices.Sorted(maps.Keys(queues)))
	runs = slices.DeleteFunc(runs, func(r activeRun) bool { return r.unsure })
	if len(runs) == 0 {
		return 0, err
	}
	cmds, _, perr := i.takeover.records(ctx, runs)
	if perr != nil {
		return 0, perr
	}
	// A first look by the local clock; the script decides by Redis'.
	now := time.Now().Add(500 * time.Millisecond).UnixMilli()
	took := 0
	note := func(e error) { // the first error met is the pass's
		if err == nil {
			err = e
		}
	}
	take := func(r activeRun, token int64) {
		ok, terr := i.takeover.takeOver(ctx, r, token)
		if ok {
			took++
		}
		note(terr)
	}
	for n, r := range runs {
		rec, rerr := cmds[n].Result()
		state, token, until, ok := parseRecord(rec)
		if rerr == nil && !ok {
			rerr = ErrCorrupt // not one of the middleware's records
		}
		if rerr != nil && !errors.Is(rerr, redis.Nil) {
			note(fmt.Errorf("zclaim: run record of %q: %w", short(r.key), rerr))
			continue
		}
		if ok && state == "free" && finalRelease(r, until) {
			continue // a failure that ended its task: asynq's recovery archives it
		}
		if errors.Is(rerr, redis.Nil) || (ok && state == "free") {
			// No run holds the key while asynq holds the task: its worker
			// has not reached the middleware's Begin (a worker without this
			// middleware, an outer middleware that waits), or died before
			// it (no record), or after the middleware released a failed
			// run and before asynq recorded the failure ("free"; also when
			// asynq's own write failed). No run record says whether that
			// worker lives: asynq's lease of the task does, which its
			// server renews every 5 s. Taken over once its server stopped
			// renewing it (workersGone: last renewed more than 12 s ago,
			// 7 s to 14 s after the worker died, where asynq's recoverer
			// moves the task 30 s to 90 s after that renewal),
			// for a task type this middleware handles (others are not its
			// work). A task that a store's AsynqClient dequeued is marked
			// with its process, which beats while it lives: taken over
			// within a Lease of that process's death (heldGone), whatever
			// its type, as asynq's recoverer would move it, only sooner.
			// A task with no asynq lease at all is left as asynq
			// leaves it: its run may have finished longer ago than
			// Retention, and running it again would repeat it.
			if _, ok := i.types.Load(r.task.Type); !r.gone || !ok && !r.held {
				continue
			}
			take(r, token)
			continue
		}
		if ok && state == "take" {
			// Taken over: its task went back to its queue, and a worker
			// took it again without beginning it. A server without the
			// middleware (a rolling deploy) runs it there; one with it
			// begins it at once. So it is taken over again only once that
			// worker is gone too, as asynq's lease of the task tells:
			// never from under a live server that runs it.
			if r.gone && until <= now {
				take(r, token)
			}
			continue
		}
		if !ok || state != "run" || until > now {
			continue
		}
		take(r, token)
	}
	return took, err
}

// finalRelease reports whether r's run was released ("free", with until
// its record's number) after a failure that ends its task: one the
// middleware released as final, or of the task's last attempt.
func finalRelease(r activeRun, until int64) bool {
	return until != 0 || r.task.Retried >= r.task.MaxRetry
}

// takeOver marks r's abandoned run (of token: 0 for a task whose run never
// began; a released run's for one whose failure asynq never recorded) as
// taken over, then puts its task back at the front of its queue in
// asynq's own keys (requeue): the task the dead worker held, not a copy of
// it, so that no second task of the work exists for asynq to bring back
// later, and any server of the queue, with the middleware or without it,
// runs it at most as often as asynq's own recovery would, only sooner and
// with no retry spent. A server with the middleware begins it as a
// resumed run. It reports whether it moved the task, and the error of a
// script that Redis refused (a failed move is logged here; the take
// marker lapses after a lease and a later pass tries again).
func (tk *takeover) takeOver(ctx context.Context, r activeRun, token int64) (bool, error) {
	i := tk.i
	lease := i.opts.Lease
	bucket, field := i.doneOf(r.key)
	keys := []string{i.recordKey(r.key), bucket}
	if !i.opts.NoHistory {
		keys = append(keys, historyOf(bucket, i.opts.Prefix))
	}
	reply, err := takeoverScript.Run(ctx, i.rdb, keys, strconv.FormatInt(token, 10), ms(lease), ms(lease), field,
		ms(i.opts.Retention), thisProcess()).Result()
	if err != nil {
		return false, fmt.Errorf("zclaim: take over the run of %q: %w", short(r.key), err)
	}
	raw, ok := int64s(reply)
	if !ok || len(raw) != 2 || raw[0] != 1 {
		return false, nil
	}
	silent := time.Duration(raw[1]) * time.Millisecond
	ti := r.task
	moved, err := requeue(ctx, i.asynqRedis(), ti.Queue, ti.ID)
	if err != nil {
		i.log.LogAttrs(ctx, slog.LevelWarn,
			"zclaim: could not put an abandoned run's task back on its queue; trying again later",
			slog.String("key", short(r.key)), slog.Int64("token", token), slog.String("error", err.Error()))
		return false, nil
	}
	if !moved {
		// asynq moved or finished the task meanwhile.
		return false, nil
	}
	i.takeovers.Add(1)
	i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: took over a run whose worker is gone",
		slog.String("key", short(r.key)), slog.Int64("token", token), slog.Duration("silent", silent),
		slog.String("task", short(ti.ID)), slog.String("queue", ti.Queue))
	return true, nil
}
