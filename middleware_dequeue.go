package zclaim

// A run's Begin made in the step that dequeues its task: the other half of
// AsynqClient (middleware_done.go has the Complete).

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

//go:embed lua/dequeue.lua
var dequeueLua string

// asynqDequeue is the SHA1 of asynq v0.26's dequeue script, whose writes
// dequeue.lua makes.
const asynqDequeue = "a8153319360adc71cdc370107f8ab9786f204765"

// maxDequeueTypes bounds the task types dequeue.lua begins the runs of
// (each an argument of every dequeue); a store whose middleware handled
// more begins the runs of the first ones there, the rest as usual.
const maxDequeueTypes = 16

// preBegun is the run that dequeue.lua began for an asynq task, until the
// middleware takes it (preBegunOf).
type preBegun struct {
	key, bucket, field string // the run's key (the task's id), and where the script looked for it finished
	token              int64  // the run's token; 0: the key had finished
	sent               time.Time
	// undone is made when the loop takes the run back (sweepPre), and
	// closed once its record is gone.
	undone chan struct{}
}

// dequeueScript returns dequeue.lua for the store, once readyDone has
// settled its buckets, and whether it begins runs (dequeueBegins); nil
// where writes wait for replicas (AsynqClient is then the store's client
// as it is).
func (i *Idempotency) dequeueScript() (*redis.Script, bool) {
	if i.repl.n > 0 {
		return nil, false
	}
	begins := i.dequeueBegins()
	var tags strings.Builder // the slots' tags (64 KB): only where it begins runs
	if begins && !i.doneTagged {
		for _, t := range slotTags() {
			tags.WriteString(t + "    "[len(t):])
		}
	}
	crc := make([]byte, 0, 512)
	for x := 0; x < 256; x++ {
		c := crc16(string([]byte{byte(x)}))
		crc = append(crc, byte(c>>8), byte(c))
	}
	head := fmt.Sprintf("local PREFIX, TAGGED, DONE_SUB, TAGS, CRC, CRC0, MAXLEN = %s, %t, %d, %s, %s, %d, %d\n",
		luaString(i.opts.Prefix), i.doneTagged, i.doneSub, luaString(tags.String()), luaString(string(crc)),
		crc16(i.opts.Prefix), MaxIDLen)
	lease, ttl, retention := ms(i.opts.Lease), ms(i.opts.Lease+i.opts.Retention), ms(i.opts.Retention)
	// The options go into the body alone: a prefix may hold their names.
	return redis.NewScript(head + storeBody(dequeueLua, lease, ttl, retention)), begins
}

// dequeueBegins reports whether dequeue.lua begins the runs of the tasks
// it takes. It begins none, and only takes tasks ahead, where the
// middleware's key of a task is not its id (a Key function of the
// user's), on Redis Cluster (asynq's keys and the store's are in
// different slots), or where the store digests its keys with SHA-256 (one
// made by an earlier version), which Lua in Redis computes about 80 times
// slower than SHA-1.
func (i *Idempotency) dequeueBegins() bool {
	return i.defaultKey && !i.cluster && i.doneSHA1
}

// luaString quotes s for Lua 5.1: bytes other than printable ASCII, quotes
// and backslashes as \ddd.
func luaString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '\'')
	for _, c := range []byte(s) {
		if c >= ' ' && c < 0x7f && c != '\'' && c != '\\' {
			b = append(b, c)
			continue
		}
		b = append(b, '\\', '0'+c/100, '0'+c/10%10, '0'+c%10)
	}
	return string(append(b, '\''))
}

// handled notes that the middleware handled a task of type typ, whose
// runs asynq's dequeue begins from then on (dequeue.lua's ARGV[4..]).
func (i *Idempotency) handled(typ string) {
	if _, ok := i.types.Load(typ); ok {
		return
	}
	i.types.Store(typ, true)
	i.typesMu.Lock()
	defer i.typesMu.Unlock()
	old := i.dequeueTypes.Load()
	if old != nil && (len(*old) >= maxDequeueTypes || slices.Contains(*old, any(typ))) {
		return
	}
	var next []any
	if old != nil {
		next = append(next, *old...)
	}
	next = append(next, typ)
	i.dequeueTypes.Store(&next)
}

// dequeue makes asynq's dequeue (keys, args) with dequeue.lua, which takes
// up to TakeAhead tasks and begins their runs (where dequeueBegins), and
// returns the first task's message as asynq's script would have replied
// (redis.Nil for none); nil where the store does not send dequeue.lua. It answers from
// the tasks the last dequeue of the queue took ahead, where it holds any
// (middleware_prefetch.go).
func (i *Idempotency) dequeue(ctx context.Context, keys []string, args []any) *redis.Cmd {
	s := i.deq.Load()
	if s == nil || len(keys) != 4 || len(args) != 2 ||
		!strings.HasPrefix(keys[0], "asynq:{") || !strings.HasSuffix(keys[0], "}:pending") {
		return nil
	}
	prefix, ok := args[1].(string)
	if !ok {
		return nil
	}
	q := keys[0][len("asynq:{") : len(keys[0])-len("}:pending")]
	cmd := redis.NewCmd(ctx)
	t, ok, k := i.ahead.next(q)
	if ok {
		cmd.SetVal(t.msg)
		return cmd
	}
	a := make([]any, 0, 8)
	a = append(a, args[0], prefix, k, i.held.start(i))
	keys = append(keys[:4:4], heldKey(q))
	if types := i.dequeueTypes.Load(); types != nil && i.deqBegins.Load() {
		a = append(a, *types...)
	}
	sent := time.Now()
	reply, err := s.Run(ctx, i.rdb, keys, a...).Result()
	r, ok := reply.([]any)
	switch {
	case err != nil:
		cmd.SetErr(err)
		return cmd
	case !ok || len(r)%5 != 0 || len(r) > 5*k:
		cmd.SetErr(zerr("zclaim: asynq's dequeue: %w: reply %v", ErrCorrupt, reply))
		return cmd
	case len(r) == 0:
		cmd.SetErr(redis.Nil)
		return cmd
	}
	ts := make([]takenTask, len(r)/5)
	for j := range ts {
		msg, _ := r[5*j].(string)
		id, _ := r[5*j+1].(string)
		tok, _ := r[5*j+2].(int64)
		ts[j] = takenTask{msg: msg, id: id}
		if tok >= 0 {
			bucket, _ := r[5*j+3].(string)
			field, _ := r[5*j+4].(string)
			ts[j].pre = &preBegun{key: id, bucket: bucket, field: field, token: tok, sent: sent}
			i.guards.holdPre(i, q+"\x00"+id, ts[j].pre)
		}
	}
	i.keepAhead(q, keys, prefix, k, len(ts), ts[1:])
	cmd.SetVal(ts[0].msg)
	return cmd
}

// holdPre keeps p for its task's handler, or for the loop.
func (gs *guards) holdPre(i *Idempotency, task string, p *preBegun) {
	gs.mu.Lock()
	if gs.pre == nil {
		gs.pre = make(map[string]*preBegun)
	}
	old := gs.pre[task]
	gs.pre[task] = p
	gs.run(i, i.opts.Lease)
	gs.mu.Unlock()
	if old != nil {
		go i.undoPre(old)
	}
}

// preBegunOf returns the run that asynq's dequeue began for the task of
// ctx, whose key is key: an Execution, ErrAlreadyDone, or (nil, nil) where
// it began none (or one of another record than key's, which it undoes).
func (i *Idempotency) preBegunOf(ctx context.Context, key string) (*Execution, error) {
	if !i.deqBegins.Load() {
		return nil, nil
	}
	q, ok := asynq.GetQueueName(ctx)
	id, ok2 := asynq.GetTaskID(ctx)
	if !ok || !ok2 {
		return nil, nil
	}
	return i.takePre(ctx, q, id, key)
}

// takePre is preBegunOf for the task id of queue q.
func (i *Idempotency) takePre(ctx context.Context, q, id, key string) (*Execution, error) {
	gs := &i.guards
	gs.mu.Lock()
	p := gs.pre[q+"\x00"+id]
	if p != nil && p.undone == nil {
		delete(gs.pre, q+"\x00"+id)
	}
	gs.mu.Unlock()
	if p == nil {
		return nil, nil
	}
	if p.undone != nil { // the loop is taking it back: Begin once it has
		select {
		case <-p.undone:
		case <-ctx.Done():
		}
		return nil, nil
	}
	e := i.execution(key, p.token)
	if p.key != key || p.bucket != e.keys[1] || p.field != e.field {
		if p.token != 0 {
			i.undoPre(p)
		}
		return nil, nil
	}
	if p.token == 0 {
		return nil, fmt.Errorf("%w: key %q", ErrAlreadyDone, key)
	}
	i.state.poll()
	e.sent, e.leaseUntil, e.state = p.sent, time.UnixMilli(p.token/1000+ms(i.opts.Lease)), i.state.current()
	return e, nil
}

// undoScript deletes a run record that dequeue.lua wrote and no handler
// took (ARGV[1]: the record as written), leaving the key as it found it.
var undoScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// undoPre deletes the run record p began (best effort: one left runs out
// with its lease, as a dead worker's).
func (i *Idempotency) undoPre(p *preBegun) {
	if p.token == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	rec := preRecord(p.token, i.opts.Lease)
	if err := undoScript.Run(ctx, i.rdb, []string{i.recordKey(p.key)}, rec).Err(); err != nil {
		i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not undo a run begun for a task no handler took",
			slog.String("key", short(p.key)), slog.String("error", err.Error()))
	}
}

// sweepPre takes back the run p began for task, whose handler did not take
// it within Lease/2 (sweepPreAfter): the task's handler is not this store's
// middleware, or asynq did not call it (the task's deadline had passed, the
// server was shutting down). Its record is deleted before its lease
// runs out, so that no takeover takes the task for a dead worker's; a
// handler that comes for it meanwhile waits, then begins as usual.
func (i *Idempotency) sweepPre(task string, p *preBegun) {
	i.undoPre(p)
	gs := &i.guards
	gs.mu.Lock()
	if gs.pre[task] == p {
		delete(gs.pre, task)
	}
	gs.mu.Unlock()
	close(p.undone)
}

// sweepPreAfter: the loop takes back a run begun in asynq's dequeue that no
// handler took within this part of the lease.
const sweepPreAfter = 2

// flushPre undoes every run begun for a task no handler took yet (Close).
func (i *Idempotency) flushPre() {
	gs := &i.guards
	gs.mu.Lock()
	pre := gs.pre
	gs.pre = nil
	gs.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pre {
		wg.Add(1)
		go func() { defer wg.Done(); i.undoPre(p) }()
	}
	wg.Wait()
}
