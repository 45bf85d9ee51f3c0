package a

import (
	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// A Lua script claims in one request.
var claim = redis.NewScript(`
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 10)
if #ids > 0 then redis.call('ZREM', KEYS[1], unpack(ids)) end
return ids`)

func lua(rdb *redis.Client) {
	claim.Run(ctx, rdb, []string{"delay:jobs"}, "1700000000")
}

// An optimistic transaction: WATCH, read, MULTI/EXEC.
func watched(rdb *redis.Client, key string) {
	rdb.Watch(ctx, func(tx *redis.Tx) error {
		ids := tx.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
		tx.ZRem(ctx, key, ids)
		return nil
	}, key)
}

// Another key, a read by rank, a removal before the read, a read alone.
func otherKey(rdb *redis.Client) { // want otherKey:`read "a", rm "b"`
	ids := rdb.ZRangeByScore(ctx, "a", &redis.ZRangeBy{Max: "+inf"}).Val()
	rdb.ZRem(ctx, "b", ids)
}

func byRank(rdb *redis.Client, key string) { // want byRank:`rm ⟨p1⟩, rm ⟨p1⟩`
	ids := rdb.ZRange(ctx, key, 0, 10).Val()
	rdb.ZRem(ctx, key, ids)
	rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: key, Start: 0, Stop: 10})
	rdb.ZRem(ctx, key, ids)
}

func removeFirst(rdb *redis.Client, key string) { // want removeFirst:`rm ⟨p1⟩, read ⟨p1⟩`
	rdb.ZRem(ctx, key, "x")
	rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"})
}

func readOnly(rdb *redis.Client, key string) []string { // want readOnly:`read ⟨p1⟩`
	return rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
}

// A poller the team accepted, silenced.
func accepted(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
	rdb.ZRem(ctx, key, ids) //zclaimvet:ok single worker by design
}

// Two pollers in one file: each function on its own.
func readHere(rdb *redis.Client, key string) []string { // want readHere:`read ⟨p1⟩`
	return rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
}

func removeThere(rdb *redis.Client, key string, ids []string) { // want removeThere:`rm ⟨p1⟩`
	rdb.ZRem(ctx, key, ids)
}

// redigo's optimistic transaction: WATCH, read, MULTI, ZREM, EXEC.
func watchedRedigo(c redigo.Conn, key string) {
	c.Do("WATCH", key)
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf"))
	c.Do("MULTI")
	for _, id := range ids {
		c.Do("ZREM", key, id)
	}
	c.Do("EXEC")
}

// A read whose reply is thrown away (its members to _, or only its error
// asked for) reads no members: nothing is polled, whatever is removed
// next. Its twin keeps the members and is racy.
func discardedRead(rdb *redis.Client, c redigo.Conn, key string) error { // want discardedRead:`rm ⟨p2⟩`
	if _, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Result(); err != nil {
		return err
	}
	if err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Err(); err != nil {
		return err
	}
	_ = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val()
	if _, err := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "100")); err != nil {
		return err
	}
	if _, err := c.Do("ZRANGEBYSCORE", key, "-inf", "100"); err != nil {
		return err
	}
	rdb.ZRemRangeByScore(ctx, key, "-inf", "100")
	return nil
}

func keptRead(rdb *redis.Client, key string) error {
	ids, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Result() // want `racy poller`
	if err != nil {
		return err
	}
	run(ids[0])
	rdb.ZRemRangeByScore(ctx, key, "-inf", "100")
	return nil
}
