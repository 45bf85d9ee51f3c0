package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// Scenario 3b (-only inside): what the run records would cost asynq if
// their commands ran inside asynq's own scripts, with no round trip of
// their own. A hook on the asynq server's go-redis client sends, in place
// of asynq v0.26's dequeue and done scripts, scripts that make the same
// writes to asynq's keys (recognized by their names) and then a Begin's
// commands on the popped task's run record (TIME, the finished record's
// HGET, SET NX GET) or a Complete's (GET, HSET and PEXPIRE of a bucket,
// DEL). Nothing reaches a handler from them: the row measures Redis work
// and round trips, not a middleware that could be shipped (its record keys
// are named inside the scripts, which Redis Cluster refuses).

// insideDequeue is asynq's dequeue (a task moves from the pending list to
// the active one, under a lease) followed by a Begin's commands.
// KEYS: pending, paused, active, lease; ARGV: lease deadline, task key
// prefix. PREFIX is replaced with the records' prefix.
const insideDequeue = `
if redis.call('EXISTS', KEYS[2]) == 1 then return false end
local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[3])
if not id then return false end
local task = ARGV[2] .. id
redis.call('HSET', task, 'state', 'active')
redis.call('HDEL', task, 'pending_since')
redis.call('ZADD', KEYS[4], ARGV[1], id)
local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]
if not redis.call('HGET', 'PREFIX' .. 'done:' .. string.sub(id, -3), id) then
  redis.call('SET', 'PREFIX' .. 'run:' .. id, string.format('run %d %d', now_us, math.floor(now_us / 1000) + 30000),
    'NX', 'PX', 86430000, 'GET')
end
return redis.call('HGET', task, 'msg')`

// insideDone is asynq's done (the task leaves the active list, its lease
// and its hash; the queue's processed counters count it) followed by a
// Complete's commands. KEYS: active, lease, task, processed of the day,
// processed; ARGV: task id, the day counter's expiry, the largest int64.
const insideDone = `
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then return redis.error_reply('NOT FOUND') end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return redis.error_reply('NOT FOUND') end
if redis.call('DEL', KEYS[3]) == 0 then return redis.error_reply('NOT FOUND') end
if redis.call('INCR', KEYS[4]) == 1 then redis.call('EXPIREAT', KEYS[4], ARGV[2]) end
if tonumber(redis.call('GET', KEYS[5])) == tonumber(ARGV[3]) then
  redis.call('SET', KEYS[5], 1)
else
  redis.call('INCR', KEYS[5])
end
local run = 'PREFIX' .. 'run:' .. ARGV[1]
local rec = redis.call('GET', run)
if rec then
  local bucket = 'PREFIX' .. 'done:' .. string.sub(ARGV[1], -3)
  redis.call('HSET', bucket, ARGV[1], string.match(rec, '%d+$'))
  redis.call('PEXPIRE', bucket, 86430000)
  redis.call('DEL', run)
end
return redis.status_reply('OK')`

// insideBegin is a Begin's commands of insideDequeue in a script of
// their own. KEYS: the run record, its bucket of finished records; ARGV:
// the task id.
const insideBegin = `
local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]
if not redis.call('HGET', KEYS[2], ARGV[1]) then
  redis.call('SET', KEYS[1], string.format('run %d %d', now_us, math.floor(now_us / 1000) + 30000),
    'NX', 'PX', 86430000, 'GET')
end
return 1`

// commandHook is a go-redis hook's dials and pipelines, passed on: a hook
// that embeds it looks at single commands alone.
type commandHook struct{}

func (commandHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (commandHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// recordKeys are task id's run record and bucket of finished records
// under prefix, as insideDequeue and insideDone name them.
func recordKeys(prefix, id string) []string {
	return []string{prefix + "run:" + id, prefix + "done:" + id[max(len(id)-3, 0):]} // string.sub(id, -3)
}

// asynqScript tells asynq v0.26's dequeue and done among the commands a
// hook sees, by their key names: "dequeue", "done" or "".
func asynqScript(a []any) string {
	if len(a) < 3 || a[0] != "evalsha" {
		return ""
	}
	n, _ := a[2].(int)
	key := func(i int) string {
		if 3+i >= len(a) {
			return ""
		}
		s, _ := a[3+i].(string)
		return s
	}
	switch {
	case n == 4 && strings.HasSuffix(key(0), ":pending") && strings.HasSuffix(key(3), ":lease"):
		return "dequeue"
	case n == 5 && strings.HasSuffix(key(0), ":active") && strings.HasSuffix(key(4), ":processed"):
		return "done"
	}
	return ""
}

// beginApart sends insideBegin before the handler, one round trip a task,
// on rdb; the records are prefix's, as insideDequeue names them.
func beginApart(rdb *redis.Client, sha, prefix string) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			if err := rdb.EvalSha(ctx, sha, recordKeys(prefix, id), id).Err(); err != nil {
				return err
			}
			return next.ProcessTask(ctx, t)
		})
	}
}

// besideDone is a Complete's commands of insideDone in a script of their
// own. KEYS: the run record, its bucket of finished records; ARGV: the
// task id.
const besideDone = `
local rec = redis.call('GET', KEYS[1])
if rec then
  redis.call('HSET', KEYS[2], ARGV[1], string.match(rec, '%d+$'))
  redis.call('PEXPIRE', KEYS[2], 86430000)
  redis.call('DEL', KEYS[1])
end
return 1`

// besideHook sends, in place of asynq v0.26's done alone, a pipeline of
// besideDone for the task and that done (on rdb, the client it hooks),
// and counts them.
type besideHook struct {
	commandHook
	rdb    *redis.Client
	sha    string // besideDone's SHA1
	prefix string // the records' prefix, as insideDequeue names them
	dones  *atomic.Int64
}

func (h besideHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if asynqScript(a) != "done" || len(a) < 9 {
			return next(ctx, cmd)
		}
		id, _ := a[8].(string) // the done's ARGV[1]
		p := h.rdb.Pipeline()
		p.EvalSha(ctx, h.sha, recordKeys(h.prefix, id), id)
		p.Process(ctx, cmd)
		h.dones.Add(1)
		_, err := p.Exec(ctx)
		return err
	}
}

// insideHook sends the scripts above in place of asynq's dequeue (unless
// dequeue is empty) and done, which it tells by their key names, and
// counts them.
type insideHook struct {
	commandHook
	dequeue, done   string // the SHA1s of the scripts it sends instead
	dequeues, dones *atomic.Int64
}

func (h insideHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		switch asynqScript(a) {
		case "dequeue":
			if h.dequeue != "" {
				a[1] = h.dequeue
				h.dequeues.Add(1)
			}
		case "done":
			a[1] = h.done
			h.dones.Add(1)
		}
		return next(ctx, cmd)
	}
}

func insideScenario() {
	n := 20000
	if *quick {
		n = 3000
	}
	contenders := []string{
		"asynq alone",
		"asynq alone, its server on a go-redis client of the bench's (NewServerFromRedisClient)",
		"the records' commands inside asynq's dequeue and done scripts (that client, hooked): a Begin's and a Complete's Redis work, no round trip of their own",
		"a Begin's commands in a script of their own before the handler (one round trip a task), a Complete's inside asynq's done script (that client, hooked)",
		"asynq + idempotency middleware (two round trips a task)",
		"a Begin's commands in a script of their own before the handler, a Complete's in a script sent in one pipeline with asynq's done (that client, hooked): one round trip a task of their own",
		"asynq alone, again (the first row's twin: its ratio is the noise of a ratio)",
	}
	ctx := context.Background()
	rates := make([]samples, len(contenders))
	cpu := make([]cpuRounds, len(contenders))
	cmds := make([]float64, len(contenders))
	nr := shortRounds(len(contenders))
	for round := 1; round <= nr; round++ {
		for _, k := range slots(round, len(contenders)) {
			name := contenders[k]
			admin := newClient(4)
			queue := noopBacklog(n, "inside") // also the prefix of the run records' keys
			h, done := noopHandler(n)
			cfg := noopServerConfig(queue)
			var own *redis.Client
			var idem *zclaim.Idempotency
			var dequeues, dones atomic.Int64
			var srv *asynq.Server
			var apart *redis.Client // beginApart's
			switch k {
			case 1, 2, 3:
				own = newClient(0) // go-redis' default pool, as asynq's RedisClientOpt makes it
				if k >= 2 {
					deq, dn := strings.ReplaceAll(insideDequeue, "PREFIX", queue+":"), strings.ReplaceAll(insideDone, "PREFIX", queue+":")
					hook := insideHook{dequeue: admin.ScriptLoad(ctx, deq).Val(), done: admin.ScriptLoad(ctx, dn).Val(), dequeues: &dequeues, dones: &dones}
					if hook.dequeue == "" || hook.done == "" {
						panic("inside: SCRIPT LOAD failed")
					}
					if k == 3 {
						hook.dequeue = "" // asynq's own
						apart = newClient(32)
						sha := admin.ScriptLoad(ctx, insideBegin).Val()
						if sha == "" {
							panic("inside: SCRIPT LOAD failed")
						}
						h = beginApart(apart, sha, queue+":")(h)
					}
					own.AddHook(hook)
				}
				srv = asynq.NewServerFromRedisClient(own, cfg)
			case 5:
				own = newClient(0)
				apart = newClient(32)
				begin, complete := admin.ScriptLoad(ctx, insideBegin).Val(), admin.ScriptLoad(ctx, besideDone).Val()
				if begin == "" || complete == "" {
					panic("inside: SCRIPT LOAD failed")
				}
				h = beginApart(apart, begin, queue+":")(h)
				own.AddHook(besideHook{rdb: own, sha: complete, prefix: queue + ":", dones: &dones})
				srv = asynq.NewServerFromRedisClient(own, cfg)
			case 4:
				own = newClient(32)
				var err error
				if idem, err = zclaim.NewIdempotency(own, zclaim.IdempotencyOptions{Prefix: queue + ":run:"}); err != nil {
					panic(err)
				}
				h = idem.Middleware()(h)
			}
			if srv == nil {
				srv = asynq.NewServer(asynq.RedisClientOpt{Addr: redisAddr}, cfg)
			}
			rate, perTask, calls := serveBacklog(admin, srv, h, done, n)
			cmds[k] = calls
			if idem != nil {
				idem.Close()
			}
			if own != nil {
				own.Close()
			}
			if apart != nil {
				apart.Close()
			}
			// Every task was dequeued and done by the scripts sent instead
			// (a dequeue of an empty queue is swapped too).
			if k == 2 && (dequeues.Load() < int64(n) || dones.Load() < int64(n)) || (k == 3 || k == 5) && (dequeues.Load() > 0 || dones.Load() < int64(n)) {
				panic(fmt.Sprintf("inside: %d dequeues and %d dones swapped, for %d tasks", dequeues.Load(), dones.Load(), n))
			}
			rates[k] = append(rates[k], rate)
			cpu[k] = append(cpu[k], perTask)
			progress("inside round %d/%d, %s: %s tasks/s", round, nr, name, human(rate))
			dropKeys(admin, queue)
			admin.SRem(ctx, "asynq:queues", queue)
			admin.Close()
		}
	}
	var rows [][]string
	for k, name := range contenders {
		ratio := paired(rates[k], rates[0])
		rows = append(rows, []string{name, human(rates[k].median()), fmt.Sprintf("%.2f×", ratio.median()), ratio.middleHalf(),
			fmt.Sprintf("%.1f", cmds[k]), cpu[k].cell(), cpu[k].over(cpu[0])})
	}
	table(fmt.Sprintf("3b. The run records inside asynq's own scripts (a floor of another design): asynq server, no-op handler, %s tasks, Concurrency 16", human(float64(n))),
		[]string{"contender", "tasks/s (median)", "ratio", "ratio's middle half of rounds", "Redis commands / task (last round)", "CPU / task: Redis + client (the round of median total)", "CPU / task beyond asynq alone's (median)"},
		rows,
		"The third row swaps asynq v0.26's dequeue and done scripts, on the asynq server's own go-redis client, for scripts that write what they write and then make a Begin's and a Complete's commands on the task's run record: "+
			"the Redis work of the middleware's records without their round trips, and without the handler ever seeing a token (nothing could fence it). "+
			"It is not a middleware: it measures how far from asynq alone a design that puts the records into asynq's own calls could come, against the middleware's two round trips a task. "+
			"The fourth row keeps asynq's dequeue and swaps its done alone, and sends a Begin's commands in a script of their own before the handler: "+
			"a design whose Complete rides in asynq's done, with one round trip a task of its own. "+
			"The store's AsynqClient ships the fourth row's design with the middleware's token and fence: each Begin a call of the middleware's own (grouped with those of the same moment), each Complete inside asynq's done (table 3). "+
			"The sixth sends the Complete's commands in a script of their own, in one pipeline with asynq's done: the same round trips, and a script call more. "+
			"Ratios, middle halves and CPU as in table 3.")
}
