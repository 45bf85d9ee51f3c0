package zclaim

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// groupRunner runs single-key scripts for many callers in shared
// pipelines (group commit): a caller that finds no pipeline under way sends
// its call at once; calls that arrive meanwhile queue, and the next
// pipeline takes them all. Nothing waits on a timer, so a lone call costs
// what it did; under load, many calls share one round trip. Each caller
// gets its own result. Pipelines, unlike one script over many keys, work on
// Redis Cluster: go-redis routes each command to its node.
type groupRunner struct {
	rdb   redis.UniversalClient
	mu    sync.Mutex
	queue []*groupCall
	busy  bool
}

type groupCall struct {
	script *redis.Script
	keys   []string
	args   []any
	res    any
	err    error
	done   chan struct{}
}

// run runs script on keys for the caller. If ctx ends first it returns
// ctx's error; the script may still run (a lost reply, not a lost effect).
func (g *groupRunner) run(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	c := &groupCall{script: script, keys: keys, args: args, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if g.busy {
		g.mu.Unlock()
		select {
		case <-c.done:
			return c.res, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	g.busy = true
	g.mu.Unlock()
	// This caller sends what is queued (its own call included), then hands
	// the rest to a goroutine so that it does not keep flushing for others.
	g.flush(ctx)
	g.mu.Lock()
	if len(g.queue) > 0 {
		g.mu.Unlock()
		go g.drain(context.WithoutCancel(ctx))
	} else {
		g.busy = false
		g.mu.Unlock()
	}
	<-c.done
	return c.res, c.err
}

// drain flushes until the queue is empty.
func (g *groupRunner) drain(ctx context.Context) {
	for {
		g.flush(ctx)
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.busy = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
	}
}

// flush sends the queued calls in one pipeline and delivers their results.
func (g *groupRunner) flush(ctx context.Context) {
	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx) // the calls are others' too
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = c.script.Run(ctx, g.rdb, c.keys, c.args...).Result()
		close(c.done)
		return
	}
	pipe := g.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	pipe.Exec(ctx) // errors are read per command below
	for i, c := range batch {
		c.res, c.err = cmds[i].Result()
		if c.err != nil && strings.HasPrefix(c.err.Error(), "NOSCRIPT") {
			c.res, c.err = c.script.Run(ctx, g.rdb, c.keys, c.args...).Result()
		}
		close(c.done)
	}
}
