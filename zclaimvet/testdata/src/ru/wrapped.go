package ru

import (
	"context"

	"github.com/redis/rueidis"
)

// Conn is an interface the project declares over the client: its Do and B
// are read as rueidis' own.
type Conn interface {
	Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult
	B() rueidis.Builder
}

func viaConn(c Conn, key string) {
	ids, _ := c.Do(ctx, c.B().Zrange().Key(key).Min("-inf").Max("100").Byscore().Build()).AsStrSlice() // want `racy poller: ZRANGE BYSCORE reads due members of key here, and ZREM at wrapped\.go:\d+`
	for _, id := range ids {
		c.Do(ctx, c.B().Zrem().Key(key).Member(id).Build())
		run(id)
	}
}

// The commands built into locals first, each ZREM's count tested.
func viaConnChecked(c Conn, key string) {
	rangeCmd := c.B().Zrange().Key(key).Min("-inf").Max("100").Byscore().Limit(0, 10).Build()
	ids, err := c.Do(ctx, rangeCmd).AsStrSlice() // want `checked ZREM at wrapped\.go:\d+ after ZRANGE BYSCORE on key`
	if err != nil {
		return
	}
	for _, id := range ids {
		remCmd := c.B().Zrem().Key(key).Member(id).Build()
		removed, _ := c.Do(ctx, remCmd).AsInt64()
		if removed > 0 {
			run(id)
		}
	}
}

// A wrapper of the project's own whose Do and B take and give rueidis'
// types.
type wrapped struct{ c rueidis.Client }

func (w *wrapped) B() rueidis.Builder { return w.c.B() }

func (w *wrapped) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return w.c.Do(ctx, cmd)
}

func (w *wrapped) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	return w.c.DoMulti(ctx, cmds...)
}

func viaWrapper(w *wrapped, key string) {
	ids, _ := w.Do(ctx, w.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice() // want `racy poller`
	w.DoMulti(ctx, w.B().Zrem().Key(key).Member(ids...).Build())
	for _, id := range ids {
		run(id)
	}
}

// A sweep through the interface: the members go back to Redis only.
func sweepViaConn(c Conn, key string) {
	ids, _ := c.Do(ctx, c.B().Zrangebyscore().Key(key).Min("-inf").Max("100").Build()).AsStrSlice()
	for _, id := range ids {
		c.Do(ctx, c.B().Zrem().Key(key).Member(id).Build())
	}
}
