// Package rx polls through radix: commands as actions, radix.Cmd and radix.FlatCmd, sent with Do. // want package:"uses github.com/mediocregopher/radix"
package rx

import "github.com/mediocregopher/radix/v3"

func run(string) {}

// A read into a receiver, then a ZREM whose count nobody reads: racy.
func poll(c radix.Client, key string) {
	var ids []string
	if err := c.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "100")); err != nil { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at rx\.go:\d+`
		return
	}
	for _, id := range ids {
		run(id)
		c.Do(radix.FlatCmd(nil, "ZREM", key, id))
	}
}

// The ZREM's count read into n and tested: a check. Its twin reads the
// count and tests only the error: racy.
func pollChecked(c radix.Client, key string) {
	var ids []string
	c.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "100", "LIMIT", "0", "1")) // want `checked ZREM`
	for _, id := range ids {
		var n int
		if err := c.Do(radix.Cmd(&n, "ZREM", key, id)); err != nil || n == 0 {
			continue
		}
		run(id)
	}
}

func pollCountUntested(c radix.Client, key string) {
	var ids []string
	c.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "100", "LIMIT", "0", "1")) // want `racy poller`
	for _, id := range ids {
		var n int
		if err := c.Do(radix.Cmd(&n, "ZREM", key, id)); err != nil {
			continue
		}
		run(id)
	}
}

// Read and removal in different methods, called one after the other.
type backend struct{ c radix.Client }

func (b *backend) all() []string { // want all:`read "mqueue"`
	var out []string
	b.c.Do(radix.Cmd(&out, "ZRANGEBYSCORE", "mqueue", "-1", "+inf"))
	return out
}

func (b *backend) del(raw string) error { // want del:`rm "mqueue"`
	return b.c.Do(radix.Cmd(nil, "ZREM", "mqueue", raw))
}

func (b *backend) loop() {
	for _, it := range b.all() { // want `racy poller: ZRANGEBYSCORE \(in all\) reads due members of "mqueue" here, and ZREM \(in del\)`
		run(it)
		b.del(it)
	}
}

// Not reported: MULTI/EXEC on one connection; a read into nil (no members)
// before a cleanup.
func inMulti(c radix.Client, key string) error {
	return c.Do(radix.WithConn(key, func(conn radix.Conn) error {
		var ids []string
		conn.Do(radix.Cmd(nil, "MULTI"))
		conn.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "+inf"))
		conn.Do(radix.Cmd(nil, "ZREMRANGEBYSCORE", key, "-inf", "+inf"))
		return conn.Do(radix.Cmd(nil, "EXEC"))
	}))
}

func cleanup(c radix.Client, key string) { // want cleanup:`rm ⟨p1⟩`
	c.Do(radix.Cmd(nil, "ZRANGEBYSCORE", key, "-inf", "100"))
	c.Do(radix.Cmd(nil, "ZREMRANGEBYSCORE", key, "-inf", "100"))
}

// A ZREM after a SET NX of the id only cleans up (poll is its twin).
func setNX(c radix.Client, key string) { // want setNX:`read ⟨p1⟩`
	var ids []string
	c.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "100"))
	for _, id := range ids {
		var ok string
		if c.Do(radix.Cmd(&ok, "SET", "lock:"+id, "1", "NX", "EX", "60")); ok != "OK" {
			continue
		}
		run(id)
		c.Do(radix.Cmd(nil, "ZREM", key, id))
	}
}

// An expiry sweep through radix: the members read into a receiver go
// nowhere but back to Redis. Its twin pushes each one.
func sweepRadix(c radix.Client, key string) error {
	var ids []string
	if err := c.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "100")); err != nil || len(ids) == 0 {
		return err
	}
	for _, id := range ids {
		c.Do(radix.Cmd(nil, "DEL", "job:"+id))
	}
	return c.Do(radix.FlatCmd(nil, "ZREM", key, ids))
}

func sweepRadixPushed(c radix.Client, key string) {
	var ids []string
	c.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "100")) // want `racy poller`
	for _, id := range ids {
		c.Do(radix.Cmd(nil, "LPUSH", "ready", id))
	}
	c.Do(radix.FlatCmd(nil, "ZREM", key, ids))
}

// A script run for each member may write anything: it acts.
var markDone = radix.NewEvalScript(1, `redis.call("LPUSH", "done", KEYS[1])`)

func sweepRadixScripted(c radix.Client, key string) {
	var ids []string
	c.Do(radix.Cmd(&ids, "ZRANGEBYSCORE", key, "-inf", "100")) // want `racy poller`
	for _, id := range ids {
		c.Do(markDone.Cmd(nil, id))
	}
	c.Do(radix.FlatCmd(nil, "ZREM", key, ids))
}
