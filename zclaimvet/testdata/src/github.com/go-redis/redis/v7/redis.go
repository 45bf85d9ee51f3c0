// Package redis is a stub of go-redis v7: no context argument.
package redis

type Client struct{}

type ZRangeBy struct {
	Min, Max      string
	Offset, Count int64
}

type StringSliceCmd struct{}

func (StringSliceCmd) Val() []string { return nil }

type IntCmd struct{}

func (IntCmd) Val() int64 { return 0 }

func (*Client) ZRangeByScore(key string, opt ZRangeBy) *StringSliceCmd { return nil }
func (*Client) ZRem(key string, members ...interface{}) *IntCmd        { return nil }
