package a

import "github.com/redis/go-redis/v9"

// A checked ZREM of another key decides who goes on: the removal after it
// (of the member from an index of due times, say) cleans up. Two workers
// read the same member; only the one whose ZREM removed it from the other
// set removes it here and runs it.
func gateInline(rdb *redis.Client, due, open string) { // want gateInline:`^zset\(read ⟨p1⟩, rm ⟨p2⟩\)$`
	ids := rdb.ZRangeByScore(ctx, due, &redis.ZRangeBy{Max: "100"}).Val()
	for _, id := range ids {
		if rdb.ZRem(ctx, open, id).Val() == 0 {
			continue
		}
		rdb.ZRem(ctx, due, id)
		run(id)
	}
}

// takeOpen is a matchmaker's take: the first ZREM's count decides, the
// second cleans up.
func takeOpen(rdb *redis.Client, id string) bool { // want takeOpen:`^zset\(rm "open"\)$`
	n, err := rdb.ZRem(ctx, "open", id).Result()
	if err != nil || n == 0 {
		return false
	}
	rdb.ZRem(ctx, "waiting", id)
	return true
}

func gateHelper(rdb *redis.Client) { // want gateHelper:`^zset\(read "waiting", rm "open"\)$`
	zs := rdb.ZRangeWithScores(ctx, "waiting", 0, 19).Val()
	for _, z := range zs {
		id := z.Member.(string)
		if z.Score < 100 || !takeOpen(rdb, id) {
			continue
		}
		run(id)
	}
}

// Their twins: the other ZREM's error alone is tested, or it comes after
// the removal, or its own key is the one read.
func gateUnchecked(rdb *redis.Client, due, open string) { // want gateUnchecked:`^zset\(rm ⟨p2⟩\)$`
	ids := rdb.ZRangeByScore(ctx, due, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		if rdb.ZRem(ctx, open, id).Err() != nil {
			continue
		}
		rdb.ZRem(ctx, due, id)
		run(id)
	}
}

func gateAfter(rdb *redis.Client, due, open string) { // want gateAfter:`^zset\(rm ⟨p2⟩\)$`
	ids := rdb.ZRangeByScore(ctx, due, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		rdb.ZRem(ctx, due, id)
		if rdb.ZRem(ctx, open, id).Val() == 0 {
			continue
		}
		run(id)
	}
}

func takeLoose(rdb *redis.Client, id string) bool { // want takeLoose:`^zset\(rm "open2", rm "waiting2"\)$`
	if rdb.ZRem(ctx, "open2", id).Err() != nil {
		return false
	}
	rdb.ZRem(ctx, "waiting2", id)
	return true
}

func gateHelperLoose(rdb *redis.Client) { // want gateHelperLoose:`^zset\(rm "open2"\)$`
	zs := rdb.ZRangeWithScores(ctx, "waiting2", 0, 19).Val() // want `racy poller`
	for _, z := range zs {
		id := z.Member.(string)
		if z.Score < 100 || !takeLoose(rdb, id) {
			continue
		}
		run(id)
	}
}

// A gate decides who removes after it, not who reads: a read after it is
// its caller's to pair.
func takeThenPeek(rdb *redis.Client, id string) []string { // want takeThenPeek:`^zset\(rm "open3", read "due3"\)$`
	if rdb.ZRem(ctx, "open3", id).Val() == 0 {
		return nil
	}
	return rdb.ZRangeByScore(ctx, "due3", &redis.ZRangeBy{Max: "100"}).Val()
}

func gatePeeked(rdb *redis.Client, id string) { // want gatePeeked:`^zset\(rm "open3"\)$`
	for _, m := range takeThenPeek(rdb, id) { // want `racy poller`
		rdb.ZRem(ctx, "due3", m)
		run(m)
	}
}

// A count tested in a wrapper that removes whatever it is given decides
// nothing for each member of a batch.
func zremAny(rdb *redis.Client, key string, ids ...interface{}) bool { // want zremAny:`^zset\(rm ⟨p1⟩\)$`
	return rdb.ZRem(ctx, key, ids...).Val() > 0
}

func gateBatch(rdb *redis.Client, due, open string) { // want gateBatch:`^zset\(rm ⟨p2⟩\)$`
	ids := rdb.ZRangeByScore(ctx, due, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	members := make([]interface{}, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	if !zremAny(rdb, open, members...) {
		return
	}
	rdb.ZRem(ctx, due, members...)
	for _, id := range ids {
		run(id)
	}
}

// A worker started before the poll loop, gated as gateInline is.
func gateWorker(rdb *redis.Client, due, open string) { // want gateWorker:`^zset\(rm ⟨p2⟩, read ⟨p1⟩\)$`
	ch := make(chan string)
	go func() {
		for id := range ch {
			if rdb.ZRem(ctx, open, id).Val() == 0 {
				continue
			}
			rdb.ZRem(ctx, due, id)
			run(id)
		}
	}()
	for {
		for _, id := range rdb.ZRangeByScore(ctx, due, &redis.ZRangeBy{Max: "100"}).Val() {
			ch <- id
		}
	}
}
