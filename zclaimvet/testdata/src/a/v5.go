package a

import redisv5 "gopkg.in/redis.v5"

// go-redis before v6, imported from gopkg.in: due members read, then
// removed in a pipeline (not atomic); its twin removes from another key.
func v5(rdb *redisv5.Client, gcKey string) {
	ids, _ := rdb.ZRangeByScore(gcKey, redisv5.ZRangeBy{Max: "+inf"}).Result() // want `racy poller: ZRANGEBYSCORE reads due members of gcKey here, and ZREM at v5.go:\d+`
	pipe := rdb.Pipeline()
	for _, id := range ids {
		pipe.ZRem(gcKey, id)
		run(id)
	}
	pipe.Exec()
}

func v5TwoKeys(rdb *redisv5.Client, gcKey string) { // want v5TwoKeys:`read ⟨p1⟩, rm ⟨p1⟩ \+ ":done"`
	ids, _ := rdb.ZRangeByScore(gcKey, redisv5.ZRangeBy{Max: "+inf"}).Result()
	pipe := rdb.Pipeline()
	for _, id := range ids {
		pipe.ZRem(gcKey+":done", id)
	}
	pipe.Exec()
}
