// Package gf polls through GoFrame's Redis. // want package:"uses github.com/gogf/gf/database/gredis"
// Commands go by name with Do, or by its sorted-set methods.
package gf

import (
	"context"
	"fmt"

	gredisv1 "github.com/gogf/gf/database/gredis"
	"github.com/gogf/gf/v2/database/gredis"
	"github.com/gogf/gf/v2/frame/g"
)

func run(string) {}

func pollDo(ctx context.Context, key string) error {
	values, err := g.Redis().Do(ctx, "ZRANGEBYSCORE", key, "-inf", 100) // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at gf.go:22`
	if err != nil {
		return err
	}
	for _, id := range values.Strings() {
		if _, err := g.Redis().Do(ctx, "ZREM", key, id); err != nil {
			return err
		}
		run(id)
	}
	return nil
}

func pollDoChecked(ctx context.Context, key string) error {
	values, err := g.Redis().Do(ctx, "ZRANGEBYSCORE", key, "-inf", 100, "LIMIT", 0, 1) // want `checked ZREM`
	if err != nil || values.IsEmpty() {
		return err
	}
	raw := values.Strings()[0]
	removed, err := g.Redis().Do(ctx, "ZREM", key, raw)
	if err != nil {
		return err
	}
	if removed.Int64() == 0 {
		return nil
	}
	run(raw)
	return nil
}

func pollTyped(ctx context.Context, r *gredis.Redis, key string) error {
	ids, err := r.ZRange(ctx, key, 0, 100, gredis.ZRangeOption{ByScore: true}) // want `racy poller: ZRANGE BYSCORE reads due members of key here, and ZREM at gf.go:53`
	if err != nil {
		return err
	}
	for _, id := range ids.Strings() {
		r.ZRem(ctx, key, id)
		run(id)
	}
	return nil
}

func pollTypedChecked(ctx context.Context, r *gredis.Redis, key string) {
	ids, _ := r.ZRange(ctx, key, 0, 100, gredis.ZRangeOption{ByScore: true, WithScores: true}) // want `checked ZREM`
	for _, id := range ids.Strings() {
		if n, _ := r.ZRem(ctx, key, id); n == 1 {
			run(id)
		}
	}
}

func pollBatch(ctx context.Context, key string) {
	ids, _ := g.Redis().ZRange(ctx, key, 0, 100, gredis.ZRangeOption{ByScore: true}) // want `racy poller`
	for _, id := range ids.Strings() {
		run(id)
	}
	g.Redis().ZRemRangeByScore(ctx, key, "0", "100")
}

// A poll under a lock that Do's SET NX takes, and one after a pop.
func pollLocked(ctx context.Context, key string) {
	if ok, _ := g.Redis().SetNX(ctx, "lock:"+key, 1); !ok {
		return
	}
	ids, _ := g.Redis().ZRange(ctx, key, 0, 100, gredis.ZRangeOption{ByScore: true}) // want `poller under a lock: .* after the SETNX at`
	for _, id := range ids.Strings() {
		g.Redis().ZRem(ctx, key, id)
		run(id)
	}
}

func popThenClean(ctx context.Context, key string) { // want popThenClean:`^zset\(read ⟨p1⟩\)$`
	ids, _ := g.Redis().ZRange(ctx, key, 0, 100, gredis.ZRangeOption{ByScore: true})
	for _, id := range ids.Strings() {
		if v, _ := g.Redis().LPop(ctx, "ready:"+id); v.IsNil() {
			continue
		}
		g.Redis().ZRem(ctx, key, id)
		run(id)
	}
}

// The same with RPop.
func popRightThenClean(ctx context.Context, key string) { // want popRightThenClean:`^zset\(read ⟨p1⟩\)$`
	ids, _ := g.Redis().ZRange(ctx, key, 0, 100, gredis.ZRangeOption{ByScore: true})
	for _, id := range ids.Strings() {
		if v, _ := g.Redis().RPop(ctx, "ready:"+id); v.IsNil() {
			continue
		}
		g.Redis().ZRem(ctx, key, id)
		run(id)
	}
}

// Their twins: a read by rank whose scores are never read is no read of
// due members; another command sent by name is none of the set's.
func rankRead(ctx context.Context, key string) { // want rankRead:`^zset\(rank ⟨p1⟩, rm ⟨p1⟩\)$`
	ids, _ := g.Redis().ZRange(ctx, key, 0, 9)
	for _, id := range ids.Strings() {
		g.Redis().ZRem(ctx, key, id)
		run(id)
	}
}

func rankOption(ctx context.Context, key string) { // want rankOption:`^zset\(rank ⟨p1⟩, rm ⟨p1⟩\)$`
	ids, _ := g.Redis().ZRange(ctx, key, 0, 9, gredis.ZRangeOption{ByScore: false, Rev: true})
	for _, id := range ids.Strings() {
		g.Redis().ZRem(ctx, key, id)
		run(id)
	}
}

func otherCommand(ctx context.Context, key string) { // want otherCommand:`^zset\(rm ⟨p1⟩\)$`
	values, _ := g.Redis().Do(ctx, "SMEMBERS", key)
	for _, id := range values.Strings() {
		g.Redis().Do(ctx, "ZREM", key, id)
		run(fmt.Sprint(id))
	}
}

// A read by rank whose scores are then read, a read by rank with scores,
// and a lock that Do's SET NX takes.
func rankScored(ctx context.Context, key string) { // want rankScored:`^zset\(score ⟨p1⟩\)$`
	ids, _ := g.Redis().ZRange(ctx, key, 0, 9) // want `racy poller: ZRANGE reads due members`
	for _, id := range ids.Strings() {
		if s, _ := g.Redis().ZScore(ctx, key, id); s > 100 {
			continue
		}
		g.Redis().ZRem(ctx, key, id)
		run(id)
	}
}

func rankWithScores(ctx context.Context, key string) {
	ids, _ := g.Redis().ZRange(ctx, key, 0, 9, gredis.ZRangeOption{WithScores: true}) // want `racy poller: ZRANGE WITHSCORES reads`
	for _, id := range ids.Strings() {
		g.Redis().ZRem(ctx, key, id)
		run(id)
	}
}

func pollLockedDo(ctx context.Context, key string) {
	if v, _ := g.Redis().Do(ctx, "SET", "lock:"+key, 1, "NX", "EX", 10); v.IsNil() {
		return
	}
	values, _ := g.Redis().Do(ctx, "ZRANGEBYSCORE", key, "-inf", 100) // want `poller under a lock: .* after the SET NX at`
	for _, id := range values.Strings() {
		g.Redis().Do(ctx, "ZREM", key, id)
		run(id)
	}
}

// GoFrame v1: Do and DoVar without a context.
func pollV1(r *gredisv1.Redis, key string) {
	v, _ := r.DoVar("ZRANGEBYSCORE", key, "-inf", 100) // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at`
	for _, id := range v.Strings() {
		r.Do("ZREM", key, id)
		run(id)
	}
}
