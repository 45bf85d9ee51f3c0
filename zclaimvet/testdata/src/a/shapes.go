package a

import (
	"fmt"
	"time"

	redisv7 "github.com/go-redis/redis/v7"
	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// Shape 1: read and remove in different methods, the key a field of the
// receiver, the batch handed on between them.
type batcher struct {
	rdb     *redis.Client
	key     string
	doneKey string
}

func (q *batcher) GetBatch() []string { // want GetBatch:`read ⟨r⟩.key`
	return q.rdb.ZRangeByScore(ctx, q.key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of q.key here, and ZREMRANGEBYSCORE at shapes.go:25 removes`
}

func (q *batcher) ClearBatch(last string) { // want ClearBatch:`rm ⟨r⟩.key`
	q.rdb.ZRemRangeByScore(ctx, q.key, "-inf", last)
}

// Its twin: the other method removes from another key.
type mover struct {
	rdb     *redis.Client
	key     string
	doneKey string
}

func (m *mover) Take() []string { // want Take:`read ⟨r⟩.key`
	return m.rdb.ZRangeByScore(ctx, m.key, &redis.ZRangeBy{Max: "+inf"}).Val()
}

func (m *mover) Forget(last string) { // want Forget:`rm ⟨r⟩.doneKey`
	m.rdb.ZRemRangeByScore(ctx, m.doneKey, "-inf", last)
}

// Shape 1 with the key an argument: the caller pairs them.
func getBatch(rdb *redis.Client, key string) []string { // want getBatch:`read ⟨p1⟩`
	return rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
}

func clearBatch(rdb *redis.Client, key, last string) { // want clearBatch:`rm ⟨p1⟩`
	rdb.ZRemRangeByScore(ctx, key, "-inf", last)
}

func batchLoop(rdb *redis.Client) {
	for {
		b := getBatch(rdb, "delay:batch") // want `racy poller: ZRANGEBYSCORE \(in getBatch\) reads due members of "delay:batch" here, and ZREMRANGEBYSCORE \(in clearBatch\) at shapes.go:58 removes`
		if len(b) == 0 {
			return
		}
		clearBatch(rdb, "delay:batch", b[len(b)-1])
		runAll(b)
	}
}

// Its twin: another key.
func batchLoopTwoKeys(rdb *redis.Client) { // want batchLoopTwoKeys:`read "delay:a", rm "delay:b"`
	b := getBatch(rdb, "delay:a")
	clearBatch(rdb, "delay:b", b[0])
}

// Shape 3: read by rank with the scores compared in Go, the remove elsewhere.
func rankPoll(rdb *redis.Client, key string) {
	zs := rdb.ZRangeWithScores(ctx, key, 0, 0).Val() // want `racy poller: ZRANGE WITHSCORES reads due members of key here, and ZREM \(in removeMember\) at shapes.go:75`
	if len(zs) == 0 || zs[0].Score > float64(time.Now().Unix()) {
		return
	}
	removeMember(rdb, key, zs[0].Member)
	runAll(zs[0].Member)
}

func removeMember(rdb *redis.Client, key string, m any) { // want removeMember:`rm ⟨p1⟩`
	rdb.ZRem(ctx, key, m)
}

func rankPollRedigo(c redigo.Conn, key string) {
	reply, _ := redigo.Strings(c.Do("ZRANGE", key, 0, 0, "WITHSCORES")) // want `racy poller: ZRANGE WITHSCORES`
	c.Do("ZREM", key, reply[0])
	runAll(reply[0])
}

// Shape 4: the remove inside a pipeline's closure after a read outside it
// (racy), read and remove in one pipeline (racy: no MULTI), read and remove
// in one TxPipelined or TxPipeline (MULTI/EXEC: atomic).
func pipeRemove(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREMRANGEBYSCORE at shapes.go:95`
	rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZRemRangeByScore(ctx, key, "-inf", "+inf")
		return nil
	})
	_ = ids
}

func txRemoveAfterRead(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
	rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZRem(ctx, key, ids)
		return nil
	})
	runAll(ids)
}

func pipeBoth(rdb *redis.Client, key string) {
	rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}) // want `racy poller`
		pipe.ZRemRangeByScore(ctx, key, "-inf", "+inf")
		return nil
	})
}

func txBoth(rdb *redis.Client, key string) {
	rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"})
		pipe.ZRemRangeByScore(ctx, key, "-inf", "+inf")
		return nil
	})
}

func txPipeVar(rdb *redis.Client, key string) {
	pipe := rdb.TxPipeline()
	pipe.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"})
	pipe.ZRemRangeByScore(ctx, key, "-inf", "+inf")
	pipe.Exec(ctx)
}

func callsTxBothTwice(rdb *redis.Client) {
	txBoth(rdb, "k")
	txBoth(rdb, "k")
}

// redigo's MULTI/EXEC, and its twin with the read before MULTI.
func redigoMulti(c redigo.Conn, key string) {
	c.Send("MULTI")
	c.Send("ZRANGEBYSCORE", key, "-inf", "+inf")
	c.Send("ZREMRANGEBYSCORE", key, "-inf", "+inf")
	c.Do("EXEC")
}

func redigoReadBeforeMulti(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `racy poller`
	c.Send("MULTI")
	c.Send("ZREM", key, ids)
	c.Do("EXEC")
	runAll(ids)
}

// Shape 5: checks. A reply helper's count tested for one member is a
// check; the error alone, or a count after a batch ZREM, is not.
func redigoIntChecked(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `checked ZREM at shapes.go:159`
	for _, id := range ids {
		if n, _ := redigo.Int(c.Do("ZREM", key, id)); n == 1 {
			run(id)
		}
	}
}

func redigoBoolChecked(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `checked ZREM`
	for _, id := range ids {
		ok, err := redigo.Bool(c.Do("ZREM", key, id))
		if err != nil || !ok {
			continue
		}
		run(id)
	}
}

// A ZREM sent with Send, its count read from the connection's Receive
// and tested, is a check too: one at a time, or all the ZREMs sent and
// then each count received. Its twins: the Receive's error alone tested,
// or a reply received after the ZREM's left untested.
func redigoSendChecked(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `checked ZREM at shapes.go:183`
	for _, id := range ids {
		c.Send("ZREM", key, id)
		c.Flush()
		if n, _ := redigo.Int(c.Receive()); n == 1 {
			run(id)
		}
	}
}

func redigoSendAllChecked(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `checked ZREM`
	for _, id := range ids {
		c.Send("ZREM", key, id)
	}
	c.Flush()
	for _, id := range ids {
		if ok, _ := redigo.Bool(c.Receive()); ok {
			run(id)
		}
	}
}

func redigoSendErrOnly(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `racy poller`
	for _, id := range ids {
		c.Send("ZREM", key, id)
		c.Flush()
		if _, err := c.Receive(); err != nil {
			continue
		}
		run(id)
	}
}

func redigoSendOtherUntested(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `racy poller`
	for _, id := range ids {
		c.Send("ZREM", key, id)
		c.Send("ZCARD", key)
		c.Flush()
		n, _ := redigo.Int(c.Receive())
		left, _ := redigo.Int(c.Receive())
		if n == 1 {
			run(id)
		}
		_ = left
	}
}

func redigoSendOtherTested(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `racy poller`
	for _, id := range ids {
		c.Send("ZREM", key, id)
		c.Send("ZCARD", key)
		c.Flush()
		removed, _ := redigo.Int(c.Receive())
		left, _ := redigo.Int(c.Receive())
		if left > 0 {
			run(id)
		}
		_ = removed
	}
}

// A member kept as bytes (the job's payload, say) is one member: its
// tested count is a check. A slice of members is a batch.
func bytesChecked(c redigo.Conn, key string) {
	values, _ := redigo.ByteSlices(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf", "LIMIT", 0, 1)) // want `checked ZREM`
	for _, raw := range values {
		if n, _ := redigo.Int(c.Do("ZREM", key, raw)); n == 1 {
			run(string(raw))
		}
	}
}

func batchOfIDsCounted(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
	if rdb.ZRem(ctx, key, ids[:1]).Val() == 1 {
		run(ids[0])
	}
}

// redigo's redis.Args builder, sent spread: its first value is the key,
// through a local too. An AddFlat holds no key to read.
func argsZRem(c redigo.Conn, key string, ids ...interface{}) { // want argsZRem:`rm ⟨p1⟩`
	for _, id := range ids {
		c.Do("ZREM", redigo.Args{}.Add(key).Add(id)...)
	}
}

func argsRead(c redigo.Conn, key string, max int64) []string { // want argsRead:`read ⟨p1⟩`
	args := redigo.Args{key, "-inf"}.Add(max).Add("LIMIT", 0, 10)
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", args...))
	return ids
}

func argsPoller(c redigo.Conn) {
	ids := argsRead(c, "delay", 100) // want `racy poller: ZRANGEBYSCORE \(in argsRead\) reads due members of "delay" here, and ZREM \(in argsZRem\)`
	argsZRem(c, "delay", ids[0])
	runAll(ids)
}

func argsFlat(c redigo.Conn, q struct{ Key string }) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", redigo.Args{}.AddFlat(q)...))
	c.Do("ZREM", redigo.Args{}.AddFlat(q).Add(ids[0])...)
}

// A slice of arguments built for a spread ZREM: a literal that holds the
// key, then the members appended (the usual way to remove a batch with
// redigo), or the members gathered first and the key put in front.
func sliceZRem(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shapes.go:`
	args := []interface{}{key}
	for _, id := range ids {
		args = append(args, id)
	}
	c.Do("ZREM", args...)
	runAll(ids)
}

func sliceKeyFirst(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller`
	due := make([]interface{}, 0)
	for _, id := range ids {
		due = append(due, id)
	}
	due = append([]interface{}{key}, due...)
	c.Do("ZREM", due...)
	runAll(ids)
}

// Their twin removes from another set: nothing to report.
func sliceOtherKey(c redigo.Conn, key string) { // want sliceOtherKey:`read ⟨p1⟩, rm "seen"`
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100))
	args := []interface{}{"seen"}
	args = append(args, ids)
	c.Do("ZREM", args...)
	runAll(ids)
}

func errOnly(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller`
		if err := rdb.ZRem(ctx, key, id).Err(); err != nil {
			continue
		}
		run(id)
	}
}

func batchCount(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
	if n, _ := rdb.ZRem(ctx, key, ids).Result(); n > 0 {
		for _, id := range ids {
			run(id)
		}
	}
}

// Shape 6: a ZREM that cleans up after another atomic claim of the id
// (SET NX, a pop from a ready list); Watch with a named function or a
// function variable. Their twins without the claim are racy.
func setNXGuard(rdb *redis.Client, key string) { // want setNXGuard:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Minute).Val() {
			continue
		}
		run(id)
		rdb.ZRem(ctx, key, id)
	}
}

func setArgsGuard(rdb *redis.Client, key string) { // want setArgsGuard:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		rdb.SetArgs(ctx, "lock:"+id, 1, redis.SetArgs{Mode: "NX"})
		rdb.ZRem(ctx, key, id)
	}
}

func readyList(rdb *redis.Client) { // want readyList:`read "processing"`
	expired := rdb.ZRangeByScore(ctx, "processing", &redis.ZRangeBy{Max: "+inf"}).Val()
	id := rdb.LPop(ctx, "ready").Val()
	run(id)
	rdb.ZRem(ctx, "processing", id)
	_ = expired
}

// Shape 6b: a poll under a lock that a SET NX takes before the read:
// correct while the lock is held, and reported as such; a checked ZREM
// under it as checked. A pop before the read claims none of the poll's
// members, but the removal may clean up after it: not reported.
func lockedPoll(rdb *redis.Client, key string) {
	if !rdb.SetNX(ctx, "poller-lock", 1, 10*time.Second).Val() {
		return
	}
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `poller under a lock: ZRANGEBYSCORE reads due members of key after the SETNX at shapes\.go:\d+, and ZREM at shapes\.go:\d+ removes them`
	for _, id := range ids {
		run(id)
	}
	rdb.ZRem(ctx, key, ids)
}

func lockedPollDo(rdb *redis.Client) {
	if _, err := rdb.Do(ctx, "SET", "poller-lock", 1, "NX", "PX", 10000).Result(); err != nil {
		return
	}
	rdb.ZRangeByScore(ctx, "delay:jobs", &redis.ZRangeBy{Max: "+inf"}) // want `poller under a lock: .* after the SET NX at shapes\.go:\d+, and ZREMRANGEBYSCORE`
	rdb.ZRemRangeByScore(ctx, "delay:jobs", "-inf", "+inf")
}

func lockedChecked(rdb *redis.Client) {
	rdb.SetArgs(ctx, "poller-lock", 1, redis.SetArgs{Mode: "NX"})
	for _, id := range rdb.ZRangeByScore(ctx, "delay:jobs", &redis.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM`
		if rdb.ZRem(ctx, "delay:jobs", id).Val() == 1 {
			run(id)
		}
	}
}

func popThenPoll(rdb *redis.Client) {
	id := rdb.LPop(ctx, "ready").Val()
	rdb.ZRangeByScore(ctx, "processing", &redis.ZRangeBy{Max: "+inf"})
	rdb.ZRem(ctx, "processing", id)
}

func noGuard(rdb *redis.Client) {
	expired := rdb.ZRangeByScore(ctx, "processing", &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
	rdb.ZRem(ctx, "processing", expired)
	runAll(expired)
}

func (q *batcher) txn(tx *redis.Tx) error {
	ids := tx.ZRangeByScore(ctx, q.doneKey, &redis.ZRangeBy{Max: "+inf"}).Val()
	tx.ZRem(ctx, q.doneKey, ids)
	return nil
}

func (q *batcher) claimWatched() error {
	return q.rdb.Watch(ctx, q.txn, q.doneKey)
}

func watchedVar(rdb *redis.Client, key string) {
	txf := func(tx *redis.Tx) error {
		ids := tx.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
		tx.ZRem(ctx, key, ids)
		return nil
	}
	rdb.Watch(ctx, txf, key)
}

func notWatchedVar(rdb *redis.Client, key string) {
	f := func() {
		ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
		rdb.ZRem(ctx, key, ids)
		runAll(ids)
	}
	go f()
}

// Shape 7: ZRangeArgs built in a variable; the same key rebuilt into a new
// variable; go-redis v7 (no context). Twins: another key.
func argsInVar(rdb *redis.Client, key string) {
	args := redis.ZRangeArgs{Key: key, Start: "-inf", Stop: "+inf", ByScore: true}
	ids := rdb.ZRangeArgs(ctx, args).Val() // want `racy poller: ZRANGE BYSCORE`
	rdb.ZRem(ctx, key, ids)
	runAll(ids)
}

func argsInVarByRank(rdb *redis.Client, key string) { // want argsInVarByRank:`rm ⟨p1⟩`
	args := redis.ZRangeArgs{Key: key, Start: 0, Stop: 10}
	ids := rdb.ZRangeArgs(ctx, args).Val()
	rdb.ZRem(ctx, key, ids)
}

func rebuilt(rdb *redis.Client, queue string) {
	k := fmt.Sprintf("delay:%s", queue)
	ids := rdb.ZRangeByScore(ctx, k, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of k here`
	k2 := fmt.Sprintf("delay:%s", queue)
	rdb.ZRem(ctx, k2, ids)
	runAll(ids)
}

func rebuiltOther(rdb *redis.Client, queue string) { // want rebuiltOther:`read fmt.Sprintf\("delay:%s", ⟨p1⟩\), rm fmt.Sprintf\("done:%s", ⟨p1⟩\)`
	ids := rdb.ZRangeByScore(ctx, fmt.Sprintf("delay:%s", queue), &redis.ZRangeBy{Max: "+inf"}).Val()
	rdb.ZRem(ctx, fmt.Sprintf("done:%s", queue), ids)
}

func v7(rdb *redisv7.Client, key string) {
	for _, id := range rdb.ZRangeByScore(key, redisv7.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller`
		rdb.ZRem(key, id)
	}
}

func v7Checked(rdb *redisv7.Client, key string) {
	for _, id := range rdb.ZRangeByScore(key, redisv7.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM`
		if rdb.ZRem(key, id).Val() == 1 {
			run(id)
		}
	}
}

// Shape 1 as a delay queue of the corpus has it: the read in a goroutine,
// the removal in that goroutine's deferred closure.
func batchInGoroutine(rdb *redis.Client, keys []string) {
	for _, key := range keys {
		go func(key string) {
			batch := getBatch(rdb, key) // want `racy poller: ZRANGEBYSCORE \(in getBatch\)`
			defer func() {
				if len(batch) != 0 {
					clearBatch(rdb, key, batch[len(batch)-1])
				}
			}()
		}(key)
	}
}

// Its twin: the closure is handed on, not run here.
func batchHandedOn(rdb *redis.Client, key string) func() { // want batchHandedOn:`read ⟨p1⟩`
	batch := getBatch(rdb, key)
	_ = batch
	return func() { clearBatch(rdb, "other", "x") }
}

// Shape 3 with the scores read apart: members by rank, then each one's
// ZSCORE compared with now, then the removal. Its twin reads no score.
func rankThenScore(rdb *redis.Client, key string) { // want rankThenScore:`score ⟨p1⟩`
	for _, id := range rdb.ZRange(ctx, key, 0, 9).Val() { // want `racy poller: ZRANGE reads due members of key here`
		if rdb.ZScore(ctx, key, id).Val() > float64(time.Now().Unix()) {
			continue
		}
		rdb.ZRem(ctx, key, id)
	}
}

func rankNoScore(rdb *redis.Client, key string) { // want rankNoScore:`rank ⟨p1⟩, rm ⟨p1⟩`
	for _, id := range rdb.ZRange(ctx, key, 0, 9).Val() {
		rdb.ZRem(ctx, key, id)
	}
}

// The command in a local that holds only constants.
func commandInVar(c redigo.Conn, key string, desc bool) { // want commandInVar:`score ⟨p1⟩`
	cmd := "ZRANGE"
	if desc {
		cmd = "ZREVRANGE"
	}
	ids, _ := redigo.Strings(c.Do(cmd, key, 0, 9)) // want `racy poller: ZRANGE reads due members of key here`
	for _, id := range ids {
		if n, _ := redigo.Int(c.Do("ZSCORE", key, id)); n < int(time.Now().Unix()) {
			c.Do("ZREM", key, id)
			run(id)
		}
	}
}

// Shape 1 through a generic function called with its type argument; its
// twin removes from another key.
func dueOf[T any](rdb *redis.Client, key string) []string { // want dueOf:`read ⟨p1⟩`
	return rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
}

func genericLoop(rdb *redis.Client) {
	for _, m := range dueOf[int](rdb, "delay:generic") { // want `racy poller: ZRANGEBYSCORE \(in dueOf\) reads due members of "delay:generic" here, and ZREM at shapes.go:\d+`
		rdb.ZRem(ctx, "delay:generic", m)
	}
}

func genericLoopTwoKeys(rdb *redis.Client) { // want genericLoopTwoKeys:`read "delay:generic", rm "delay:b"`
	for _, m := range dueOf[int](rdb, "delay:generic") {
		rdb.ZRem(ctx, "delay:b", m)
	}
}

// A key of a named string type, converted where it is sent, is the
// caller's key; its twin removes from another key.
type queueKey string

func dueTyped(rdb *redis.Client, key queueKey) []string { // want dueTyped:`read ⟨p1⟩`
	return rdb.ZRangeByScore(ctx, string(key), &redis.ZRangeBy{Max: "+inf"}).Val()
}

func removeTyped(rdb *redis.Client, key queueKey, m string) { // want removeTyped:`rm ⟨p1⟩`
	rdb.ZRem(ctx, string(key), m)
}

func typedLoop(rdb *redis.Client, key queueKey) {
	for _, m := range dueTyped(rdb, key) { // want `racy poller: ZRANGEBYSCORE \(in dueTyped\) reads due members of key here, and ZREM \(in removeTyped\) at shapes.go:\d+`
		removeTyped(rdb, key, m)
	}
}

func typedLoopTwoKeys(rdb *redis.Client, key queueKey) { // want typedLoopTwoKeys:`read ⟨p1⟩, rm ⟨p1⟩ \+ ":done"`
	for _, m := range dueTyped(rdb, key) {
		removeTyped(rdb, key+":done", m)
	}
}

// Shape 1 with a third method that calls the reading one: one report, at
// the read; the caller's copy of the access is the same command.
type feeder struct {
	rdb *redis.Client
	key string
	ch  chan string
}

func (f *feeder) poll() { // want poll:`read ⟨r⟩.key`
	for _, id := range f.rdb.ZRangeByScore(ctx, f.key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of f.key here, and ZREM at shapes.go:\d+`
		f.ch <- id
	}
}

func (f *feeder) work() { // want work:`rm ⟨r⟩.key`
	for id := range f.ch {
		f.rdb.ZRem(ctx, f.key, id)
	}
}

func (f *feeder) refresh() { // want refresh:`read ⟨r⟩.key`
	f.poll()
}

// Workers started before the poll loop that feeds them remove what it
// read: racy, in a literal or a function. Twins: workers that remove
// from another key; workers that claim each id first (cleanup).
func workersFirst(rdb *redis.Client, key string) {
	ch := make(chan string)
	for i := 0; i < 4; i++ {
		go func() {
			for id := range ch {
				run(id)
				rdb.ZRem(ctx, key, id)
			}
		}()
	}
	for {
		for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shapes.go:\d+`
			ch <- id
		}
	}
}

func remover(rdb *redis.Client, key string, ch chan string) { // want remover:`rm ⟨p1⟩`
	for id := range ch {
		rdb.ZRem(ctx, key, id)
	}
}

func workerFuncFirst(rdb *redis.Client, key string) {
	ch := make(chan string)
	go remover(rdb, key, ch)
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM \(in remover\) at shapes.go:\d+`
		ch <- id
	}
}

func workersOtherKey(rdb *redis.Client, key string) { // want workersOtherKey:`rm ⟨p1⟩ \+ ":done", read ⟨p1⟩`
	ch := make(chan string)
	go remover(rdb, key+":done", ch)
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		ch <- id
	}
}

func workersClaim(rdb *redis.Client, key string) {
	ch := make(chan string)
	go func() {
		for id := range ch {
			if !rdb.SetNX(ctx, "lock:"+id, 1, time.Minute).Val() {
				continue
			}
			rdb.ZRem(ctx, key, id)
		}
	}()
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		ch <- id
	}
}

// Within one goroutine order counts, as in a function: a trim, then a
// read of what is left, is no poll.
func trimThenList(rdb *redis.Client, key string) { // want trimThenList:`rm ⟨p1⟩, read ⟨p1⟩`
	go func() {
		for {
			rdb.ZRemRangeByScore(ctx, key, "-inf", "100")
			for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "100", Max: "+inf"}).Val() {
				run(id)
			}
		}
	}()
}

// The same trim and list called from elsewhere: still no poll.
func callsTrimThenList(rdb *redis.Client) { // want callsTrimThenList:`rm "delay:trim", read "delay:trim"`
	trimThenList(rdb, "delay:trim")
}

// Workers started first, then a lock, then the poll: a poll under a lock
// (workersFirst is its twin without the lock).
func workersThenLock(rdb *redis.Client, key string) {
	ch := make(chan string)
	go remover(rdb, key, ch)
	if !rdb.SetNX(ctx, "poll-lock", 1, time.Second).Val() {
		return
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `poller under a lock: ZRANGEBYSCORE reads due members of key after the SETNX at shapes.go:\d+`
		ch <- id
	}
}

// A loop that removes the last batch before it reads the next: the removal
// comes first in the source, after the read when it runs.
func removeLastBatchFirst(rdb *redis.Client, key string) { // want removeLastBatchFirst:`rm ⟨p1⟩`
	var last []string
	for {
		if len(last) > 0 {
			rdb.ZRem(ctx, key, last) // the batch read one iteration before
		}
		last = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shapes.go:\d+ removes`
		for _, id := range last {
			run(id)
		}
	}
}

// The same over a range loop, and its twin that removes before reading
// once, outside any loop: no poll. (A trim by range before the read, in a
// loop, is no poll either: trimThenList.)
func removeLastBatchRange(rdb *redis.Client, key string, ticks <-chan struct{}) { // want removeLastBatchRange:`rm ⟨p1⟩`
	var last []string
	for range ticks {
		rdb.ZRem(ctx, key, last)
		last = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
		runAll(last)
	}
}

func removeThenReadOnce(rdb *redis.Client, key string) []string { // want removeThenReadOnce:`rm ⟨p1⟩, read ⟨p1⟩`
	rdb.ZRem(ctx, key, "stale")
	return rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val()
}

// A loop whose one transaction removes the batch the transaction before it
// read, then reads the next: each transaction is atomic, the pair across
// two of them is not. Its twin reads and removes by range in each
// transaction: a claim.
func txLoop(rdb *redis.Client, key string) {
	var last []string
	for {
		var cmd *redis.StringSliceCmd
		rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.ZRem(ctx, key, last)
			cmd = pipe.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}) // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shapes.go:\d+`
			return nil
		})
		last = cmd.Val()
		for _, id := range last {
			run(id)
		}
	}
}

func txBothLoop(rdb *redis.Client, key string) {
	for range 10 {
		txBoth(rdb, key)
	}
}

// Checked ZREMs sent together in a pipeline: each reply kept in a slice
// or map, and its count tested once the pipeline has run. Their twins keep
// the replies and test only their errors, or that they are not nil: racy.
func pipedChecks(rdb *redis.Client, key string) {
	ids, _ := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Result() // want `checked ZREM at shapes.go:\d+ after ZRANGEBYSCORE on key`
	rems := make([]*redis.IntCmd, len(ids))
	rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, id := range ids {
			rems[i] = pipe.ZRem(ctx, key, id)
		}
		return nil
	})
	for i := range ids {
		if won, err := rems[i].Result(); err != nil || won != 1 {
			continue
		}
		run(ids[i])
	}
}

func pipedAppended(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `checked ZREM`
	var rems []*redis.IntCmd
	rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, id := range ids {
			rems = append(rems, pipe.ZRem(ctx, key, id))
		}
		return nil
	})
	for i, r := range rems {
		if r.Val() == 1 {
			run(ids[i])
		}
	}
}

func pipedMap(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `checked ZREM`
	rems := map[string]*redis.IntCmd{}
	rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, id := range ids {
			rems[id] = pipe.ZRem(ctx, key, id)
		}
		return nil
	})
	for id, r := range rems {
		if n, _ := r.Result(); n > 0 {
			run(id)
		}
	}
}

func pipedErrorsOnly(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shapes.go:\d+`
	rems := make([]*redis.IntCmd, len(ids))
	rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, id := range ids {
			rems[i] = pipe.ZRem(ctx, key, id)
		}
		return nil
	})
	for i, r := range rems {
		if r.Err() != nil {
			continue
		}
		run(ids[i])
	}
}

func pipedNilChecks(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	var rems []*redis.IntCmd
	rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, id := range ids {
			rems = append(rems, pipe.ZRem(ctx, key, id))
		}
		return nil
	})
	for i, r := range rems {
		if r != nil && rems[i] != nil {
			run(ids[i])
		}
	}
}

// An expiry sweep: the members read go nowhere but back to Redis (each
// ZREM's count summed, or all of them in one ZREM), so two sweeps run
// nothing twice between them. The twins act on what they read: one
// returns on the first member it removes (a token two callers take), one
// logs each.
func sweepExpired(rdb *redis.Client, key string) int64 {
	members, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Result()
	if err != nil {
		return 0
	}
	var removed int64
	for _, m := range members {
		n, _ := rdb.ZRem(ctx, key, m).Result()
		removed += n
	}
	return removed
}

func sweepAll(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val()
	rdb.ZRem(ctx, key, ids)
}

// A sweep of sessions: their ids are read, each session's key is looked
// at and deleted, and the count of what went is returned. Its twin
// publishes each id it removes.
func sweepSessions(rdb *redis.Client, key string) (int64, error) {
	ids, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Result()
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	var n int64
	for _, id := range ids {
		if rdb.Exists(ctx, sessionKey(id)).Val() == 0 {
			continue
		}
		n += rdb.Del(ctx, sessionKey(id)).Val()
	}
	return n + rdb.ZRem(ctx, key, ids).Val(), nil
}

func sessionKey(id string) string { return fmt.Sprintf("session:%s", id) }

func sweepPublished(rdb *redis.Client, key string) int64 {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		rdb.Del(ctx, sessionKey(id))
		rdb.Publish(ctx, "expired", id)
	}
	return rdb.ZRem(ctx, key, ids).Val()
}

// A sweep through a helper of the package, handed the members: it only
// removes them, from this set and from a hash of their records, and
// returns an error. Its twin's helper marks each one's record.
func purgeDead(rdb *redis.Client, key string) error {
	expired, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Result()
	if err != nil || len(expired) == 0 {
		return err
	}
	return purgeEach(rdb, key, expired)
}

func purgeEach(rdb *redis.Client, key string, expired []string) error { // want purgeEach:`rm ⟨p1⟩`
	pipe := rdb.TxPipeline()
	for _, member := range expired {
		pipe.ZRem(ctx, key, member)
		if field := recordOf(member); field != "" {
			pipe.HDel(ctx, "jobs", field)
		}
	}
	_, err := pipe.Exec(ctx)
	return err
}

func recordOf(member string) string { return fmt.Sprintf("record:%s", member) }

func failDead(rdb *redis.Client, key string) error {
	expired, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Result() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM \(in markEach\)`
	if err != nil || len(expired) == 0 {
		return err
	}
	return markEach(rdb, key, expired)
}

func markEach(rdb *redis.Client, key string, expired []string) error { // want markEach:`rm ⟨p1⟩`
	pipe := rdb.TxPipeline()
	for _, member := range expired {
		pipe.ZRem(ctx, key, member)
		pipe.HSet(ctx, "job:"+member, "status", "failed")
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Its members kept in a field, for whoever runs them: a poll.
type pendingIDs struct{ ids []string }

func (p *pendingIDs) collect(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		rdb.ZRem(ctx, key, id)
		p.ids = append(p.ids, id)
	}
}

func takeToken(rdb *redis.Client, key string) bool {
	ids, _ := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100", Count: 1}).Result() // want `racy poller`
	for _, id := range ids {
		rdb.ZRem(ctx, key, id)
		return true
	}
	return false
}

func sweepLogged(rdb *redis.Client, key string) { // printed: in a demo, the work
	members := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, m := range members {
		rdb.ZRem(ctx, key, m)
		fmt.Println("expired", m)
	}
}

// redigo's DoContext and scripts are judged as its Do is: a push of each
// member, by DoContext or by a script, acts; a DEL by DoContext does not.
func sweepDoContext(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100))
	for _, id := range ids {
		redigo.DoContext(c, ctx, "DEL", "job:"+id)
	}
	c.Do("ZREM", redigo.Args{}.Add(key).Add(ids[0])...)
}

func pushDoContext(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller`
	for _, id := range ids {
		redigo.DoContext(c, ctx, "LPUSH", "ready", id)
	}
	c.Do("ZREM", redigo.Args{}.Add(key).Add(ids[0])...)
}

var pushScript = redigo.NewScript(1, `redis.call("LPUSH", "ready", KEYS[1])`)

func pushScripted(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller`
	for _, id := range ids {
		pushScript.Do(c, id)
	}
	c.Do("ZREM", redigo.Args{}.Add(key).Add(ids[0])...)
}

// A sweep whose deletions go in a pipeline's closure: the closure's
// statements are judged as the function's. Its twin pushes each member
// there.
func sweepPipelined(rdb *redis.Client, key string) error {
	ids, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Result()
	if err != nil || len(ids) == 0 {
		return err
	}
	_, err = rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, id := range ids {
			pipe.Del(ctx, "job:"+id)
			pipe.ZRem(ctx, key, id)
		}
		return nil
	})
	return err
}

func pushPipelined(rdb *redis.Client, key string) error {
	ids, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Result() // want `racy poller`
	if err != nil || len(ids) == 0 {
		return err
	}
	_, err = rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, id := range ids {
			pipe.ZRem(ctx, key, id)
			pipe.LPush(ctx, "ready", id)
		}
		return nil
	})
	return err
}

// Members kept as a map's keys, run from there: a poll.
func removedThenRun(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	done := map[string]bool{}
	for _, id := range ids {
		rdb.ZRem(ctx, key, id)
		done[id] = true
	}
	for id := range done {
		run(id)
	}
}

// The batch's arguments gathered in a slice that starts empty (made with
// no length, or declared without a value), the key appended first: the
// other usual ways to remove a batch with redigo.
func sliceMade(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shapes.go:`
	args := make([]interface{}, 0, len(ids)+1)
	args = append(args, key)
	for _, id := range ids {
		args = append(args, id)
	}
	c.Do("ZREM", args...)
	runAll(ids)
}

func sliceDeclared(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller`
	var args []interface{}
	args = append(args, key)
	for _, id := range ids {
		args = append(args, id)
	}
	c.Do("ZREM", args...)
	runAll(ids)
}

// redis.Args whose members are flattened in after the key.
func argsFlatMembers(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller`
	c.Do("ZREM", redigo.Args{}.Add(key).AddFlat(ids)...)
	runAll(ids)
}

// A helper that removes a batch so, called after a read.
func zremMade(c redigo.Conn, key string, ids []string) error { // want zremMade:`rm ⟨p1⟩`
	args := make([]interface{}, 0)
	args = append(args, key)
	for i := range ids {
		args = append(args, ids[i])
	}
	_, err := c.Do("ZREM", args...)
	return err
}

func helperMade(c redigo.Conn) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", "delay", "-inf", 100)) // want `racy poller: ZRANGEBYSCORE reads due members of "delay" here, and ZREM \(in zremMade\)`
	zremMade(c, "delay", ids)
	runAll(ids)
}

// Their twins: a slice made with a length (its first element is not what
// is appended), a slice that a range gives (its first element unknown).
func sliceMadeLong(c redigo.Conn, key string) { // want sliceMadeLong:`read ⟨p1⟩`
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100))
	args := make([]interface{}, 1)
	args = append(args, key, ids[0])
	c.Do("ZREM", args...)
	runAll(ids)
}

func sliceRanged(c redigo.Conn, key string, batches [][]interface{}) { // want sliceRanged:`read ⟨p1⟩`
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", 100))
	for _, args := range batches {
		args = append(args, key, ids[0])
		c.Do("ZREM", args...)
	}
	runAll(ids)
}

// The batch's arguments built in the call itself.
func sliceInline(c redigo.Conn, key string) {
	ids, _ := redigo.Values(c.Do("ZRANGEBYSCORE", key, "-inf", 100)) // want `racy poller`
	c.Do("ZREM", append([]interface{}{key}, ids...)...)
	runAll(ids)
}

// Its other twin: one method looks up the members parked at a fixed score
// (the dead ones, at 0) for its caller, the other removes those its caller
// handled: a lookup and an ack, not a batch that comes due.
type parked struct {
	rdb *redis.Client
	key string
}

func (p *parked) DeadList() []string { // want DeadList:`read fixed ⟨r⟩.key`
	return p.rdb.ZRangeByScore(ctx, p.key, &redis.ZRangeBy{Min: "0", Max: "0"}).Val()
}

func (p *parked) Count() int { // want Count:`read fixed ⟨r⟩.key`
	opt := &redis.ZRangeBy{Min: "0", Max: "0"}
	return len(p.rdb.ZRangeByScore(ctx, p.key, opt).Val())
}

func (p *parked) First() []string { // want First:`read fixed ⟨r⟩.key`
	return p.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: p.key, Start: 0, Stop: 0, ByScore: true, Count: 1}).Val()
}

func (p *parked) Done(members ...any) error { // want Done:`rm ⟨r⟩.key`
	return p.rdb.ZRem(ctx, p.key, members...).Err()
}

// A function that reads a fixed score itself and removes what it read
// runs it: a poll, whatever the score (members parked at 0 to run now).
func runParked(rdb *redis.Client) {
	for _, m := range rdb.ZRangeByScore(ctx, "parked", &redis.ZRangeBy{Min: "0", Max: "0"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of "parked" here, and ZREM at shapes.go:1134 removes`
		rdb.ZRem(ctx, "parked", m)
		run(m)
	}
}

// The same lookup by a command sent by name (redigo, the bounds a number
// and a string), and reads of a range: up to a constant, and of one score
// that a parameter names; neither is fixed, and the last is a lookup its
// callers judge (lookupscore.go).
func deadIDs(c redigo.Conn, key string) ([]string, error) { // want deadIDs:`read fixed ⟨p1⟩`
	return redigo.Strings(c.Do("ZREVRANGEBYSCORE", key, 0, "0"))
}

func upTo(c redigo.Conn, key string) ([]string, error) { // want upTo:`^zset\(read ⟨p1⟩\)$`
	return redigo.Strings(c.Do("ZRANGE", key, "-inf", 0, "BYSCORE"))
}

func atScore(c redigo.Conn, key string, now int64) ([]string, error) { // want atScore:`^zset\(lookup ⟨p1⟩\)$`
	return redigo.Strings(c.Do("ZRANGEBYSCORE", key, now, now))
}
