package tnone

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A Redis server's own test of ZRANGEBYSCORE and ZREM: not a poller.
func TestZRangeByScore(t *testing.T) {
	rdb := &redis.Client{}
	ids := rdb.ZRangeByScore(context.Background(), "z", &redis.ZRangeBy{Max: "+inf"}).Val()
	rdb.ZRem(context.Background(), "z", ids)
	t.Log(ids)
}
