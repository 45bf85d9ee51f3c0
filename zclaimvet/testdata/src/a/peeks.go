package a

import (
	"github.com/redis/go-redis/v9"
)

// A delay store whose poll is one script (it reads the due ids and
// removes them), with a peek for monitoring and a removal of the id its
// caller names: the peek hands its ids to no removal of the store's own,
// so it pairs with nothing (quiet).
type peeking struct {
	rdb *redis.Client
	key string
}

const takeDue = `
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #ids > 0 then
	redis.call('ZREM', KEYS[1], unpack(ids))
end
return ids`

func (p *peeking) poll(now string) any {
	return p.rdb.Eval(ctx, takeDue, []string{p.key}, now, 100)
}

func (p *peeking) peek(now string) []string { // want peek:`^zset\(read ⟨r⟩.key\)$`
	return p.rdb.ZRangeByScore(ctx, p.key, &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
}

func (p *peeking) remove(id string) { // want remove:`^zset\(rm ⟨r⟩.key\)$`
	p.rdb.ZRem(ctx, p.key, id)
}

// Its twin's script only adds: nothing takes due members in one step, so
// the read in one method and the removal in another are a poll's halves
// (reported).
type adding struct {
	rdb *redis.Client
	key string
}

const addLater = `return redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])`

func (a *adding) add(at, id string) any {
	return a.rdb.Eval(ctx, addLater, []string{a.key}, at, id)
}

func (a *adding) due(now string) []string { // want due:`^zset\(read ⟨r⟩.key\)$`
	return a.rdb.ZRangeByScore(ctx, a.key, &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of a.key here, and ZREM at peeks.go:\d+ removes them`
}

func (a *adding) done(id string) { // want done:`^zset\(rm ⟨r⟩.key\)$`
	a.rdb.ZRem(ctx, a.key, id)
}
