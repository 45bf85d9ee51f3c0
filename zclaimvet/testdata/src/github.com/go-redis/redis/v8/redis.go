// Package redis is a stub of go-redis v8.
package redis

import "context"

type Client struct{}

type ZRangeBy struct {
	Min, Max      string
	Offset, Count int64
}

type StringSliceCmd struct{}

func (StringSliceCmd) Result() ([]string, error) { return nil, nil }

type IntCmd struct{}

func (IntCmd) Val() int64 { return 0 }

func (*Client) ZRangeByScore(ctx context.Context, key string, opt *ZRangeBy) *StringSliceCmd {
	return nil
}
func (*Client) ZRem(ctx context.Context, key string, members ...interface{}) *IntCmd { return nil }
