package zclaim

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// group commits the run-record scripts of one store (Begin, Extend,
// Complete, Release) that are called at the same moment: a call made while
// fewer than groupRounds rounds are on their way to Redis goes at once,
// alone; calls made while that many are wait for one of them to return
// and then go together, in one pipeline, led by the first of them. Every
// call still returns only once Redis answered it, so a Complete is on
// Redis before the middleware hands its task back to asynq; grouping
// changes the number of round trips, never what is written.
type group struct {
	rdb   redis.UniversalClient
	mu    sync.Mutex
	busy  int     // rounds on their way to Redis
	queue []*call // calls waiting for the next round, its leader first
}

// groupRounds is how many rounds of one store may be on their way to
// Redis at once. With one, Redis idles while each round's reply travels
// back and the next is written, and every handler that meets a round on
// its way waits for it; with a few, Redis stays busy and calls group only
// when more than that many are made at the same moment.
const groupRounds = 4

// call is one script call of a round.
type call struct {
	s    *redis.Script
	keys []string
	args []any
	cmd  *redis.Cmd
	// done receives false when the call's round answered it, true when
	// the call is to lead the next round.
	done  chan bool
	round []*call // the round it leads: itself first, then the calls queued behind it
}

// run runs s as replication{}.run would, in a round of its own or with
// the calls made while another round was on its way.
func (g *group) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	g.mu.Lock()
	if g.busy < groupRounds {
		g.busy++
		g.mu.Unlock()
		cmd := replication{}.run(ctx, g.rdb, s, keys, args...)
		g.next()
		return cmd
	}
	c := &call{s: s, keys: keys, args: args, done: make(chan bool, 1)}
	g.queue = append(g.queue, c)
	g.mu.Unlock()
	if lead := <-c.done; !lead {
		return c.cmd
	}
	round := c.round
	c.round = nil
	g.send(context.WithoutCancel(ctx), round)
	for _, o := range round[1:] {
		o.done <- false
	}
	g.next()
	return c.cmd
}

// next hands the next round to the first call waiting, or ends the
// group's business until the next call.
func (g *group) next() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.busy--
		return
	}
	lead := g.queue[0]
	lead.round, g.queue = g.queue, nil
	lead.done <- true
}

// send runs a round's calls: alone for one, else in one pipeline
// (pipelinedScripts).
func (g *group) send(ctx context.Context, round []*call) {
	if len(round) == 1 {
		c := round[0]
		c.cmd = replication{}.run(ctx, g.rdb, c.s, c.keys, c.args...)
		return
	}
	cmds := pipelinedScripts(ctx, g.rdb, len(round), func(i int) (*redis.Script, []string, []any) {
		return round[i].s, round[i].keys, round[i].args
	})
	for i, c := range round {
		c.cmd = cmds[i]
	}
}
