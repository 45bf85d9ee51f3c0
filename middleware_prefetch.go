package zclaim

// The tasks dequeue.lua takes beyond the one asynq asked for: asynq's
// processor dequeues one task a round trip, in one goroutine, and on the
// store's AsynqClient the next dequeues of the queue are answered from
// what the last one took.

import (
	"context"
	"log/slog"
	"time"
)

// takeAheadHold is how long a task taken ahead waits for asynq's next
// dequeue of its queue before it goes back (ahead.hold: at most Lease/4).
const takeAheadHold = 20 * time.Millisecond

// grow doubles how many tasks the next dequeue takes, up to most: asynq
// asked for all that a full dequeue took.
func (aq *aheadQueue) grow(most int) { aq.k = min(2*aq.k, most) }

// next returns the task taken ahead that asynq's dequeue of queue q gets,
// if any, and how many tasks a dequeue of q takes otherwise.
func (a *ahead) next(q string) (t takenTask, ok bool, k int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	aq := a.qs[q]
	if aq == nil {
		return takenTask{}, false, 1
	}
	if len(aq.tasks) == 0 {
		return takenTask{}, false, aq.k
	}
	t, aq.tasks = aq.tasks[0], aq.tasks[1:]
	if len(aq.tasks) == 0 {
		aq.tasks = nil
		if aq.batch == aq.k {
			aq.grow(a.most)
		}
	}
	return t, true, 0
}

// took records a dequeue of queue q (keys, prefix: asynq's) that asked for
// k tasks and took n, of which rest go to asynq's next dequeues; it
// returns the generation that give back takes.
func (a *ahead) took(q string, keys []string, prefix string, k, n int, rest []takenTask) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.qs == nil {
		a.qs = make(map[string]*aheadQueue)
	}
	aq := a.qs[q]
	if aq == nil {
		aq = &aheadQueue{k: 1}
		a.qs[q] = aq
	}
	aq.keys, aq.prefix = keys, prefix
	aq.tasks = append(aq.tasks, rest...)
	aq.batch = n
	aq.gen++
	if len(aq.tasks) == 0 && n == k && k == aq.k {
		aq.grow(a.most)
	}
	return aq.gen
}

// takeBack removes the tasks of queue q taken ahead (only if the dequeue
// of generation gen filled them; any, for gen 0) and returns them with the
// queue's keys and prefix of task keys.
func (a *ahead) takeBack(q string, gen uint64) ([]takenTask, []string, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	aq := a.qs[q]
	if aq == nil || len(aq.tasks) == 0 || gen != 0 && aq.gen != gen {
		return nil, nil, ""
	}
	ts := aq.tasks
	aq.tasks = nil
	aq.k = max(1, aq.k/2)
	return ts, aq.keys, aq.prefix
}

// keepAhead keeps rest, the tasks of queue q that a dequeue (keys, prefix:
// asynq's) which asked for k took beyond the first of its n, for asynq's
// next dequeues of q; those still there after takeAheadHold go back.
func (a *ahead) keepAhead(q string, keys []string, prefix string, k, n int, rest []takenTask) {
	i := a.i
	gen := i.ahead.took(q, keys, prefix, k, n, rest)
	if len(rest) == 0 {
		return
	}
	time.AfterFunc(i.ahead.hold, func() { i.ahead.giveBack(q, gen) })
}

// giveBack puts the tasks of queue q taken ahead (by the dequeue of
// generation gen; any, for 0) back where asynq's next dequeue takes them
// first, in their order: asynq did not ask for them in time (its workers
// were all busy, or it stopped).
func (a *ahead) giveBack(q string, gen uint64) {
	i := a.i
	ts, qkeys, prefix := i.ahead.takeBack(q, gen)
	if len(ts) == 0 {
		return
	}
	keys := []string{qkeys[0], qkeys[2], qkeys[3], heldKey(q)}
	args := []any{prefix, time.Now().UnixNano()}
	for _, t := range ts {
		args = append(args, t.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := givebackScript.Run(ctx, i.rdb, keys, args...).Err(); err != nil {
		// They stay active under asynq's lease, marked as this process's:
		// asynq's recovery, or the takeover once this process is gone,
		// brings them back.
		i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not give back tasks taken ahead of asynq's dequeue",
			slog.String("queue", q), slog.Int("tasks", len(ts)), slog.String("error", err.Error()))
	}
}

// flushAhead gives back every task taken ahead (Close).
func (a *ahead) flushAhead() {
	i := a.i
	i.ahead.mu.Lock()
	qs := make([]string, 0, len(i.ahead.qs))
	for q := range i.ahead.qs {
		qs = append(qs, q)
	}
	i.ahead.mu.Unlock()
	for _, q := range qs {
		i.ahead.giveBack(q, 0)
	}
}
