package zclaim

// The lease of a running handler: its guard, the store's loop that starts
// the heartbeats of handlers that outlive Lease/4, and the heartbeat.

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// add adds g, and starts the loop unless it runs.
func (gs *guards) add(g *leaseGuard, lease time.Duration) {
	gs.mu.Lock()
	if gs.set == nil {
		gs.set = make(map[*leaseGuard]struct{})
	}
	gs.set[g] = struct{}{}
	gs.run(g.i, lease)
	gs.mu.Unlock()
}

// run starts the loop unless it runs; gs.mu is held.
func (gs *guards) run(i *Idempotency, lease time.Duration) {
	if !gs.running {
		gs.running = true
		go gs.loop(i, lease)
	}
}

// remove removes g (its handler returned, or its heartbeat started).
func (gs *guards) remove(g *leaseGuard) {
	gs.mu.Lock()
	delete(gs.set, g)
	gs.mu.Unlock()
}

// loop starts, every Lease/12, the heartbeats of the guards whose handler
// has run Lease/4, and sends the late Completes that have waited as long;
// it ends when it finds none of them left.
func (gs *guards) loop(i *Idempotency, lease time.Duration) {
	tick := time.NewTicker(max(lease/12, time.Millisecond/4))
	defer tick.Stop()
	var due []*leaseGuard
	var late []*lateComplete
	for range tick.C {
		now := time.Now()
		gs.mu.Lock()
		if len(gs.set) == 0 && len(gs.late) == 0 {
			gs.running = false
			gs.mu.Unlock()
			return
		}
		for g := range gs.set {
			if now.Sub(g.since) >= lease/4 {
				due = append(due, g)
				delete(gs.set, g)
			}
		}
		for k, l := range gs.late {
			if now.Sub(l.since) >= lease/4 {
				late = append(late, l)
				delete(gs.late, k)
			}
		}
		gs.mu.Unlock()
		for k, g := range due {
			g.start()
			due[k] = nil
		}
		due = due[:0]
		for k, l := range late {
			go gs.sendLate(l)
			late[k] = nil
		}
		late = late[:0]
	}
}

// start starts the heartbeat, unless the handler has returned.
func (g *leaseGuard) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	g.stop, g.hbDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(g.hbDone)
		g.i.heartbeat(g.ctx, g.e, g.cancel, g.stop)
	}()
}

// end stops the heartbeat (waiting for it to end) and cancels the
// handler's context.
func (g *leaseGuard) end() {
	g.i.guards.remove(g)
	g.mu.Lock()
	g.stopped = true
	stop, done := g.stop, g.hbDone
	g.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	g.cancel(nil)
}

// heartbeat renews e's lease every Lease/3 until stop is closed. When the
// lease is lost, or is not renewed before it ends (as the local clock
// conservatively reckons it, whether or not a renewal is still waiting on
// Redis), it cancels the handler with cause ErrLeaseLost.
func (i *Idempotency) heartbeat(ctx context.Context, e *Execution,
	cancel context.CancelCauseFunc, stop <-chan struct{}) {
	lease := i.opts.Lease
	// Begin's lease started no earlier than it was sent, so sent+lease is
	// no later than its deadline by Redis' clock.
	localDeadline := e.sent.Add(lease)
	expire := time.NewTimer(time.Until(localDeadline))
	defer expire.Stop()
	tick := time.NewTicker(lease / 3)
	defer tick.Stop()
	kick := make(chan struct{}, 1) // renew at once: the first Lease/4 has passed
	kick <- struct{}{}
	type result struct {
		start time.Time
		err   error
	}
	results := make(chan result, 1)
	pending := false
	renew := func() {
		if pending {
			return
		}
		pending = true
		go func(start time.Time) {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), lease)
			defer rcancel()
			results <- result{start, e.Extend(rctx)}
		}(time.Now())
	}
	for {
		select {
		case <-stop:
			return
		case <-expire.C:
			i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: lease not renewed before it ended; cancelling the handler",
				slog.String("key", short(e.Key)), slog.Int64("token", e.Token))
			cancel(ErrLeaseLost)
			return
		case <-kick:
			renew()
		case <-tick.C:
			renew()
		case r := <-results:
			pending = false
			switch {
			case r.err == nil:
				localDeadline = r.start.Add(lease)
				expire.Reset(time.Until(localDeadline))
			case errors.Is(r.err, ErrLeaseLost):
				i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: lease lost; cancelling the handler",
					slog.String("key", short(e.Key)), slog.Int64("token", e.Token))
				cancel(ErrLeaseLost)
				return
			default:
				i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: lease renewal failed; trying again",
					slog.String("key", short(e.Key)), slog.String("error", r.err.Error()))
			}
		}
	}
}
