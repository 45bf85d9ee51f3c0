package zclaim

// Tasks held before their run begins. A task that asynq's dequeue hands
// to a worker has no run record until the middleware's Begin: a worker
// that dies in between (in an outer middleware, or holding tasks taken
// ahead) leaves nothing that says so, and asynq's own lease of the task
// tells only after two missed renewals (12 s). On the store's
// AsynqClient, the dequeue marks each task it takes with the process that
// holds it (dequeue.lua: one field of a hash among asynq's keys of the
// queue), and
// the process beats while it lives (a sorted set of the store's: holder
// -> its last beat, by Redis' clock, every Lease/3). A takeover pass
// takes a marked task with no run record for its dead holder's once that
// holder has not beaten for a Lease: within Lease + a pass of the death,
// as a begun run's.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// liveKey is the store's sorted set of live holders (holder -> its last
// beat, Unix ms by Redis' clock).
func (h *holder) liveKey() string { return h.i.opts.Prefix + doneInfix + ":live" }

// beatsKept is how long a holder's last beat is kept once it stopped: its
// marks are read as a dead holder's meanwhile, and as no holder's after.
const beatsKept = 10 * time.Minute

// start starts the beat loop, once, and returns the holder's id.
func (h *holder) start() string {
	h.once.Do(func() {
		var b [8]byte
		rand.Read(b[:])
		h.id = hex.EncodeToString(b[:])
		h.stop, h.done = make(chan struct{}), make(chan struct{})
		h.mu.Lock()
		h.on.Store(true)
		h.mu.Unlock()
		// The first beat goes before the first mark: a mark never names
		// a holder that has not beaten.
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		h.beat(ctx)
		cancel()
		go h.beatLoop()
	})
	return h.id
}

// begun notes that the run of task id of queue q began (or found its key
// done or running): its mark goes at the next beat. A process whose
// AsynqClient took no task (a server on another client) pays no lock.
func (h *holder) begun(q, id string) {
	if !h.on.Load() {
		return
	}
	h.mu.Lock()
	if h.on.Load() {
		if h.began == nil {
			h.began = map[string][]string{}
		}
		h.began[q] = append(h.began[q], id)
	}
	h.mu.Unlock()
}

func (h *holder) beatLoop() {
	i := h.i
	defer close(h.done)
	tick := time.NewTicker(max(i.opts.Lease/3, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(i.opts.Lease/3, time.Second))
		h.beat(ctx)
		cancel()
	}
}

// beat writes the holder's beat and takes out the marks of the tasks whose
// runs began, in one round trip (a pipeline: the marks are in their
// queues' slots).
func (h *holder) beat(ctx context.Context) {
	i := h.i
	h.mu.Lock()
	begun := h.began
	h.began = nil
	h.mu.Unlock()
	var bc *redis.Cmd
	_, err := i.asynqRedis().Pipelined(ctx, func(p redis.Pipeliner) error {
		bc = beatScript.Eval(ctx, p, []string{h.liveKey()}, h.id, ms(beatsKept)) // small: no EVALSHA in a pipeline
		for q, ids := range begun {
			p.HDel(ctx, heldKey(q), ids...)
		}
		return nil
	})
	if err == nil {
		err = bc.Err()
	}
	if err != nil {
		i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: the beat of this process's held tasks failed; trying again",
			slog.String("holder", h.id), slog.String("error", err.Error()))
	}
}

// stopHolder ends the beat loop and takes the holder out of the live set
// (Close): its marks are no holder's from then on, and the tasks they
// name are left to asynq's lease of them.
func (h *holder) stopHolder() {
	i := h.i
	h.once.Do(func() {})
	h.mu.Lock()
	on := h.on.Swap(false)
	h.mu.Unlock()
	if !on {
		return
	}
	close(h.stop)
	<-h.done
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	h.beat(ctx) // the last marks
	i.asynqRedis().ZRem(ctx, h.liveKey(), h.id)
}

// heldGone marks the runs among runs[ask] whose task is marked as held by
// a holder that stopped beating more than a Lease ago (now, by Redis'
// clock) and that still holds it: asynq's lease of the task was last
// renewed no later than the holder's last beat allows. A task that asynq's
// recovery moved on and another server took since (after asynq's lease of
// it ran out, 30 s after the holder's last renewal) has a later lease, and
// is not its. Errors leave the runs as they are.
func (tk *takeover) heldGone(ctx context.Context, runs []activeRun, ask []int, now time.Time) {
	i := tk.i
	if len(ask) == 0 {
		return
	}
	rdb := i.asynqRedis()
	marks := make([]*redis.StringCmd, len(ask))
	leases := make([]*redis.FloatCmd, len(ask))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, n := range ask {
			t := runs[n].task
			marks[k] = p.HGet(ctx, heldKey(t.Queue), t.ID)
			leases[k] = p.ZScore(ctx, asynqKey(t.Queue, "lease"), t.ID)
		}
		return nil
	}); err != nil && !isReplyErr(err) {
		return
	}
	var holders []string
	for _, c := range marks {
		if c.Err() == nil {
			holders = append(holders, c.Val())
		}
	}
	if len(holders) == 0 {
		return
	}
	beats, err := rdb.ZMScore(ctx, i.held.liveKey(), holders...).Result()
	if err != nil {
		return
	}
	last := make(map[string]float64, len(holders))
	for k, h := range holders {
		last[h] = beats[k]
	}
	dead := float64(now.Add(-i.opts.Lease).UnixMilli())
	for k, n := range ask {
		b, ok := last[marks[k].Val()]
		lease, lerr := leases[k].Result()
		if marks[k].Err() != nil || !ok || b == 0 || b >= dead || lerr != nil {
			continue
		}
		// asynq's lease (Unix s, by the worker's clock) is its last renewal
		// + 30 s: by the holder, no later than a beat interval after its
		// last beat (5 s more for the clocks).
		if lease <= (b+float64(ms(i.opts.Lease/3)))/1000+asynqLease.Seconds()+5 {
			runs[n].gone, runs[n].held = true, true
		}
	}
}

// sweepMarks drops, in one pipeline, the marks of tasks no longer active
// in queues qs (sweep.lua: only where a queue has more marks than active
// tasks): tasks asynq finished before their holder's next beat, or whose
// handler is not the middleware's, which no Begin took the mark of.
// Errors are the pass's next look's.
func (h *holder) sweepMarks(ctx context.Context, qs []string) {
	if len(qs) == 0 {
		return
	}
	pipelinedScripts(ctx, h.i.asynqRedis(), len(qs), func(k int) (*redis.Script, []string, []any) {
		return sweepScript, []string{heldKey(qs[k]), asynqKey(qs[k], "active")}, nil
	})
}
