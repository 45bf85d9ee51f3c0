// Package redis is a stub of redigo.
package redis

import "context"

type Conn interface {
	Do(command string, args ...interface{}) (interface{}, error)
	Send(command string, args ...interface{}) error
	Flush() error
	Receive() (reply interface{}, err error)
}

func Strings(reply interface{}, err error) ([]string, error)    { return nil, nil }
func Int(reply interface{}, err error) (int, error)             { return 0, nil }
func Bool(reply interface{}, err error) (bool, error)           { return false, nil }
func ByteSlices(reply interface{}, err error) ([][]byte, error) { return nil, nil }

type Args []interface{}

func (args Args) Add(value ...interface{}) Args { return append(args, value...) }
func (args Args) AddFlat(v interface{}) Args    { return args }

// DoContext sends a command on c, under ctx.
func DoContext(c Conn, ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	return nil, nil
}

// Script is a Lua script, run with Do.
type Script struct{}

func NewScript(keyCount int, src string) *Script                           { return nil }
func (*Script) Do(c Conn, keysAndArgs ...interface{}) (interface{}, error) { return nil, nil }

func Values(reply interface{}, err error) ([]interface{}, error) { return nil, nil }
