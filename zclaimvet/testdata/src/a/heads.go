package a

import (
	"encoding/json"
	"time"

	"github.com/redis/go-redis/v9"
)

// A scheduler takes the head of its set by rank (its due time is in the
// member, not the score), tests the time in Go and removes it: a pop in two
// requests, whatever the score; two schedulers both run the head
// (reported). A listing of the whole set that removes the one member its
// caller names stays quiet (actions.go).
type headJob struct {
	ID  string
	At  time.Time
	Raw string
}

type heads struct {
	rdb *redis.Client
	key string
}

func (h *heads) top() *headJob { // want top:`^zset\(rank ⟨r⟩.key\)$`
	ms := h.rdb.ZRange(ctx, h.key, 0, 0).Val()
	if len(ms) == 0 {
		return nil
	}
	var j headJob
	json.Unmarshal([]byte(ms[0]), &j)
	j.Raw = ms[0]
	return &j
}

func (h *heads) drop(j *headJob) { // want drop:`^zset\(rm ⟨r⟩.key\)$`
	h.rdb.ZRem(ctx, h.key, j.Raw)
}

func (h *heads) tick() {
	j := h.top() // want `racy poller: ZRANGE \(in top\) reads due members of h.key here, and ZREM \(in drop\) at heads.go:\d+ removes them`
	if j == nil || j.At.After(time.Now()) {
		return
	}
	h.drop(j)
	run(j.ID)
}

// The same pop with the ZREM's count tested: checked.
func (h *heads) tickChecked() {
	ms := h.rdb.ZRange(ctx, h.key, 0, 0).Val() // want `checked ZREM at heads.go:\d+ after ZRANGE on h.key`
	if len(ms) == 0 {
		return
	}
	if h.rdb.ZRem(ctx, h.key, ms[0]).Val() == 1 {
		run(ms[0])
	}
}
