package zclaim

// asynq's dequeue on the store's AsynqClient: up to TakeAhead tasks a call
// (middleware_prefetch.go answers the next dequeues from them), each
// marked as held by this process until its run begins (middleware_held.go).
// middleware_done.go has the other half of AsynqClient, the Complete.

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// handled notes that the middleware handled a task of type typ.
func (i *Idempotency) handled(typ string) {
	if _, ok := i.types.Load(typ); !ok {
		i.types.Store(typ, true)
	}
}

// dequeue makes asynq's dequeue (keys, args) with dequeue.lua, which takes
// up to TakeAhead tasks and marks each as held by this process, and
// returns the first task's message as asynq's script would have replied
// (redis.Nil for none); nil where the store does not send dequeue.lua
// (writes wait for replicas: AsynqClient is then the store's client as it
// is). It answers from the tasks the last dequeue of the queue took ahead,
// where it holds any (middleware_prefetch.go).
func (a *ahead) dequeue(ctx context.Context, keys []string, args []any) *redis.Cmd {
	i := a.i
	if i.repl.n > 0 {
		return nil
	}
	prefix, ok := args[1].(string)
	if !ok {
		return nil
	}
	q := strings.TrimSuffix(strings.TrimPrefix(keys[0], "asynq:{"), "}:pending")
	cmd := redis.NewCmd(ctx)
	t, ok, k := i.ahead.next(q)
	if ok {
		cmd.SetVal(t.msg)
		return cmd
	}
	reply, err := dequeueScript.Run(ctx, i.rdb, append(keys[:4:4], heldKey(q)), args[0], prefix, k,
		i.held.start()).Result()
	r, ok := reply.([]any)
	switch {
	case err != nil:
		cmd.SetErr(err)
		return cmd
	case !ok || len(r)%2 != 0 || len(r) > 2*k:
		cmd.SetErr(zerr("zclaim: asynq's dequeue: %w: reply %v", ErrCorrupt, reply))
		return cmd
	case len(r) == 0:
		cmd.SetErr(redis.Nil)
		return cmd
	}
	ts := make([]takenTask, len(r)/2)
	for j := range ts {
		ts[j].msg, _ = r[2*j].(string)
		ts[j].id, _ = r[2*j+1].(string)
	}
	i.ahead.keepAhead(q, keys, prefix, k, len(ts), ts[1:])
	cmd.SetVal(ts[0].msg)
	return cmd
}
