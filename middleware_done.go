package zclaim

// A run's Complete sent in one round trip with asynq's own record of its
// task's success: the client of AsynqClient, for the asynq server.

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// AsynqClient returns the store's Redis client for the asynq server whose
// handlers this store's middleware wraps (asynq.NewServerFromRedisClient).
// It is the asynq adapter (asynq_adapter.go): it knows asynq v0.26's
// dequeue and done scripts by their SHA1s, and passes any other call on
// as it is. Where a part does not apply (another asynq, another script),
// the store says so (Stats().AdapterOff, a Warn, zclaim doctor) and every
// task still runs at most once.
//
// Taking ahead and holder marks: a dequeue of asynq's takes the tasks the
// next ones get, up to IdempotencyOptions.TakeAhead (8 by default; 1
// takes one, as asynq does), and the client answers asynq's next
// dequeues of the queue from them, with no round trip (asynq's processor
// dequeues one task at a time, in one goroutine). How many it takes
// doubles from 1 while asynq asks for all a dequeue took, and halves when
// some go back: a task asynq does not ask for within 20 ms (or Lease/4,
// if less) goes back to the front of its queue, as does every task still
// held at Close. Meanwhile such a task is active in asynq's lists with no
// worker, and one taken just before its queue was paused may still start.
// Each task taken is marked as held by this process until its run
// begins, and the process beats every Lease/3 while it lives: a worker
// killed before its runs began (tasks taken ahead, or waiting in an outer
// middleware) has them taken over within Lease, as a begun run's.
//
// Complete: a run whose handler succeeded is completed with asynq's own
// call that marks its task done, ahead of it, in the same order of writes
// (the run is finished on Redis before asynq's done of its task). Under
// asynq v0.26 the two are one script, done.lua, sent in place of asynq's
// and making the writes asynq's makes; on Redis Cluster, they go in one
// pipeline. Every other call goes to the store's client as it is. Close
// the client you gave NewIdempotency, not this one, and only after the
// server has shut down.
//
// The middleware holds a Complete back for asynq's done once the client has
// carried one of asynq's dones of the task's queue. A Complete whose done
// has not come through it within Lease/4 (another server of that queue on
// another client; asynq lost its own lease of the task, and writes
// nothing) is sent alone then, and Close sends those still held. So give
// the client to every asynq server whose handlers use this store's
// middleware. Where IdempotencyOptions.AsynqRedis names another client
// than the store's, or writes wait for replicas (WaitReplicas), it returns
// that client as it is and each Begin and Complete goes alone.
func (i *Idempotency) AsynqClient() redis.UniversalClient {
	if a := i.opts.AsynqRedis; a != nil && a != i.rdb {
		return a
	}
	if i.repl.n > 0 {
		return i.rdb
	}
	return asynqClient{i.rdb, i}
}

// asynqClient is the store's client, for an asynq server: it takes tasks
// ahead in asynq's dequeue, and sends the Complete a run holds back with
// asynq's done of the run's task.
type asynqClient struct {
	redis.UniversalClient
	i *Idempotency
}

// EvalSha is the call of asynq's scripts (redis.Script.Run).
// The adapter's parts apply under knownAsynq's release line and the
// scripts it knows by SHA1; a call of asynq's in a shape they know under
// another script goes on as it is, and is reported (adapterOff).
func (c asynqClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	i := c.i
	if i.adapter.known && looksLikeDequeue(keys, args) {
		if sha == i.adapter.dequeue {
			if cmd := i.ahead.dequeue(ctx, keys, args); cmd != nil {
				return cmd
			}
		} else {
			i.adapterOff(ctx, "its dequeue script is not the one zclaim knows (SHA1 "+sha+", not "+i.adapter.dequeue+
				"): no tasks taken ahead, and a worker that dies before its run's Begin is taken over only "+
				"once asynq's lease of its task says so (7 s to 14 s)")
		}
	}
	if l := i.lateFor(keys, args); l != nil {
		_, known := asynqDones[sha]
		if known && i.adapter.known && !i.cluster {
			return i.completeIn(ctx, l, keys, args)
		}
		if !known && i.adapter.known && !i.cluster {
			i.adapterOff(ctx, "its done script is not one zclaim knows (SHA1 "+sha+"): a run's Complete goes "+
				"beside asynq's done in one pipeline, not inside it")
		}
		return i.completeWith(ctx, l, func(p redis.Pipeliner) *redis.Cmd { return p.EvalSha(ctx, sha, keys, args...) })
	}
	return c.UniversalClient.EvalSha(ctx, sha, keys, args...)
}

// Eval is the call of asynq's scripts that Redis did not have loaded.
func (c asynqClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if l := c.i.lateFor(keys, args); l != nil {
		return c.i.completeWith(ctx, l, func(p redis.Pipeliner) *redis.Cmd { return p.Eval(ctx, script, keys, args...) })
	}
	return c.UniversalClient.Eval(ctx, script, keys, args...)
}

// asynqDones are the SHA1s of asynq v0.26's scripts that mark a task done
// (done, done with a unique key, mark as complete, the same with a unique
// key), whose writes done.lua makes.
var asynqDones = map[string]struct{}{
	"1241eaa1c73409baaf1fea0c08d203a4911bda15": {},
	"a2631c71357a54b4c3e7450b1757e7f3f49d6c81": {},
	"117dca952700588e559c7ace20b925096d587974": {},
	"ce6833ccce362a8c0ee53beee413341daf52e39c": {},
}

// completeLater holds back the Complete of run e, whose handler returned
// (skipped: with ErrAlreadyDone), for asynq's done of its task, and
// reports whether it did: only once the store's AsynqClient has carried
// one of asynq's dones of the task's queue.
func (i *Idempotency) completeLater(ctx context.Context, e *Execution, skipped bool) bool {
	q, ok := asynq.GetQueueName(ctx)
	if !ok {
		return false
	}
	if _, ok := i.viaDone.Load(q); !ok {
		return false
	}
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return false
	}
	i.holdLate(&lateComplete{e: e, skipped: skipped, task: asynqKey(q, "t:"+id), since: time.Now()})
	return true
}

// holdLate holds l back for its task's done, or for the loop. A Complete
// held for the same task before (its done never came) goes now.
func (i *Idempotency) holdLate(l *lateComplete) {
	gs := &i.guards
	gs.mu.Lock()
	if gs.late == nil {
		gs.late = make(map[string]*lateComplete)
	}
	old := gs.late[l.task]
	gs.late[l.task] = l
	gs.run(i, i.opts.Lease)
	gs.mu.Unlock()
	if old != nil {
		go i.completeNow(old)
	}
}

// lateFor takes the Complete held back for the task of an asynq call
// (keys, args) that marks the task done, if any: asynq's done or mark as
// complete (knownAsynq's keys; the task's key in them, its id the first
// argument). Such a call tells the store that a server takes the tasks
// of that queue through its AsynqClient.
func (i *Idempotency) lateFor(keys []string, args []any) *lateComplete {
	k, q := asynqDoneKey(keys, args)
	if k == "" {
		return nil
	}
	if _, ok := i.viaDone.Load(q); !ok {
		i.viaDone.Store(q, true)
	}
	gs := &i.guards
	gs.mu.Lock()
	l := gs.late[k]
	if l != nil {
		delete(gs.late, k)
	}
	gs.mu.Unlock()
	return l
}

// asynqDoneKey is the task's key and its queue when keys and args are
// those of asynq's done (KEYS: active, lease, the task, the processed
// counters, [the unique key]; ARGV[1] the task id) or mark as complete
// (KEYS: active, lease, completed, the task, ...), else "".
func asynqDoneKey(keys []string, args []any) (task, queue string) {
	if len(keys) < 5 || len(args) < 3 || !strings.HasPrefix(keys[0], "asynq:{") || !strings.HasSuffix(keys[0], "}:active") {
		return "", ""
	}
	id, ok := args[0].(string)
	p := strings.TrimSuffix(keys[0], "active") // asynq:{<queue>}:
	if !ok || keys[1] != p+"lease" {
		return "", ""
	}
	task, queue = p+"t:"+id, p[len("asynq:{"):len(p)-2]
	if keys[2] == task || keys[2] == p+"completed" && keys[3] == task {
		return task, queue
	}
	return "", ""
}

// completeWith sends the Complete l holds back and asynq's call (asynq) in
// one pipeline, in that order, and returns asynq's reply.
func (i *Idempotency) completeWith(ctx context.Context, l *lateComplete, asynqCall func(redis.Pipeliner) *redis.Cmd) *redis.Cmd {
	var cc, ac *redis.Cmd
	_, perr := i.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		cc = i.complete.EvalSha(ctx, p, l.e.keys, l.e.completeArgs()...)
		ac = asynqCall(p)
		return nil
	})
	neverRan(perr, cc, ac)
	i.lateSent(ctx, l, cc)
	return ac
}

// completeIn sends the Complete l holds back and asynq's done (keys,
// args: one of asynqDones') in one script, done.lua, and returns asynq's
// part of its reply as asynq's script would have replied.
func (i *Idempotency) completeIn(ctx context.Context, l *lateComplete, keys []string, args []any) *redis.Cmd {
	ca := l.e.completeArgs()
	k := make([]string, 0, 2+len(keys))
	k = append(append(k, l.e.keys...), keys...)
	a := make([]any, 0, 2+len(ca)+len(args))
	a = append(append(append(a, len(l.e.keys), len(ca)), ca...), args...)
	reply, err := i.done.Run(ctx, i.rdb, k, a...).Result()
	cc, ac := redis.NewCmd(ctx), redis.NewCmd(ctx)
	r, ok := reply.([]any)
	switch {
	case err != nil:
		cc.SetErr(err)
		ac.SetErr(err)
	case !ok || len(r) != 2:
		cc.SetVal(reply) // settled finds it corrupt
		ac.SetErr(zerr("zclaim: asynq's done: %w: reply %v", ErrCorrupt, reply))
	default:
		for j, c := range []*redis.Cmd{cc, ac} {
			if e, ok := r[j].(error); ok {
				c.SetErr(e)
			} else {
				c.SetVal(r[j])
			}
		}
	}
	i.lateSent(ctx, l, cc)
	return ac
}

// lateSent reads cc, the reply of l's Complete sent with asynq's done: a
// Complete that did not run (Redis unreachable, its script not loaded:
// done.lua replies whenever it ran) is held again, for asynq's next try of
// its done or the loop; one that ran is counted and logged.
func (i *Idempotency) lateSent(ctx context.Context, l *lateComplete, cc *redis.Cmd) {
	if err := cc.Err(); err != nil && !isReply(err) {
		i.retryLate(l)
		return
	}
	_, err := l.e.settled(context.WithoutCancel(ctx), "complete", cc)
	i.afterComplete(ctx, l.e, l.skipped, err)
}

// isReply tells an error a script replied (WRONGTYPE, ZCLAIM_CORRUPT)
// from one that kept it from running (NOSCRIPT, the network's).
func isReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !redis.HasErrorPrefix(err, "NOSCRIPT") && !retryable(err)
}

// retryLate holds l back again, due at once: asynq's next try of its done
// or the loop sends it, whichever comes first.
func (i *Idempotency) retryLate(l *lateComplete) {
	l.since = time.Time{}
	i.holdLate(l)
}

// completeNow sends l's Complete alone: its task's done did not come
// through the store's AsynqClient in time.
func (i *Idempotency) completeNow(l *lateComplete) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	i.afterComplete(ctx, l.e, l.skipped, l.e.Complete(ctx))
}

// flushLate sends every Complete still held back, alone (Close).
func (i *Idempotency) flushLate() {
	gs := &i.guards
	gs.mu.Lock()
	late := gs.late
	gs.late = nil
	gs.mu.Unlock()
	for _, l := range late {
		i.completeNow(l)
	}
}

// afterComplete counts and logs the Complete of run e, which returned
// cerr, and returns the error for asynq; skipped tells that the handler
// found the work done (ErrAlreadyDone).
func (i *Idempotency) afterComplete(ctx context.Context, e *Execution, skipped bool, cerr error) error {
	if skipped {
		i.count(cerr, &i.skipped)
	} else {
		i.count(cerr, &i.completed)
	}
	if cerr != nil {
		i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not complete a run",
			slog.String("key", short(e.Key)), slog.Int64("token", e.Token), slog.String("error", cerr.Error()))
		return zerr("zclaim: complete %q: %w", e.Key, cerr)
	}
	return nil
}

// count counts a run's settling: ok when err is nil, a lost lease when it
// matches ErrLeaseLost (a Redis error counts nothing).
func (i *Idempotency) count(err error, ok *atomic.Int64) {
	switch {
	case err == nil:
		ok.Add(1)
	case errors.Is(err, ErrLeaseLost):
		i.leaseLost.Add(1)
	}
}
