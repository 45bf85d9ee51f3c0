// Package rwrap wraps redigo the way many projects do. // want package:"uses github.com/gomodule/redigo/redis"
// One Do sends any command, and a function per command forwards its arguments.
package rwrap

import "github.com/gomodule/redigo/redis"

var Pool interface{ Get() redis.Conn }

func Do(command string, args ...interface{}) (interface{}, error) { // want Do:`sends ⟨p0⟩ ⟨p1⟩...`
	c := Pool.Get()
	return c.Do(command, args...)
}

func ZRANGEBYSCORE(args ...interface{}) ([]string, error) { // want ZRANGEBYSCORE:`read ⟨p0\[0\]⟩`
	return redis.Strings(Do("ZRANGEBYSCORE", args...))
}

func ZREM(args ...interface{}) error { // want ZREM:`rm ⟨p0\[0\]⟩`
	_, err := Do("ZREM", args...)
	return err
}

func LPUSH(args ...interface{}) error {
	_, err := Do("LPUSH", args...)
	return err
}

// Conn is the project's interface over redigo's connection, for its
// tests' fakes: its callers need not import redigo.
type Conn interface {
	Do(commandName string, args ...interface{}) (reply interface{}, err error)
}
