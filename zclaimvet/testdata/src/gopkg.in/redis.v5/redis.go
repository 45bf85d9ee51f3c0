// Package redis is a stub of go-redis v5 (gopkg.in/redis.v5): no context
// argument, a pipeline of its own.
package redis

type Client struct{}

type ZRangeBy struct {
	Min, Max      string
	Offset, Count int64
}

type StringSliceCmd struct{}

func (StringSliceCmd) Result() ([]string, error) { return nil, nil }

type IntCmd struct{}

func (IntCmd) Val() int64 { return 0 }

type Pipeline struct{}

func (*Pipeline) ZRem(key string, members ...interface{}) *IntCmd { return nil }
func (*Pipeline) Exec() ([]interface{}, error)                    { return nil, nil }

func (*Client) ZRangeByScore(key string, opt ZRangeBy) *StringSliceCmd { return nil }
func (*Client) ZRem(key string, members ...interface{}) *IntCmd        { return nil }
func (*Client) Pipeline() *Pipeline                                    { return nil }
