package a

import (
	"fmt"
	"io"
	"log"
	"log/slog"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// An expiry sweep that logs what it expired, by the log packages or by a
// helper of its own that only logs: two such sweeps run nothing twice.
func sweepLoggedBatch(c redigo.Conn, key string) error {
	keys, err := redigo.Values(c.Do("ZRANGEBYSCORE", key, "-inf", 100))
	if err != nil || len(keys) == 0 {
		return err
	}
	c.Send("MULTI")
	c.Send("DEL", keys...)
	c.Send("ZREM", append([]interface{}{key}, keys...)...)
	if _, err := c.Do("EXEC"); err != nil {
		return err
	}
	names := make([]string, 0, len(keys))
	for _, k := range keys {
		names = append(names, fmt.Sprintf("%s", k))
	}
	slog.Info("expired", "key", key, "members", names)
	return nil
}

func noteExpired(id string) {
	log.Printf("expired %s", id)
}

func sweepNoted(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val()
	for _, id := range ids {
		rdb.Del(ctx, "job:"+id)
		rdb.ZRem(ctx, key, id)
		noteExpired(id)
	}
}

// Their twins: a member written to a writer (a connection, a response),
// and a helper that logs and then runs it.
func sweepPrinted(rdb *redis.Client, key string, w io.Writer) {
	members := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, m := range members {
		rdb.ZRem(ctx, key, m)
		fmt.Fprintln(w, "expired", m)
	}
}

func noteAndRun(id string) {
	log.Printf("expired %s", id)
	run(id)
}

func sweepNotedRun(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		rdb.ZRem(ctx, key, id)
		noteAndRun(id)
	}
}
