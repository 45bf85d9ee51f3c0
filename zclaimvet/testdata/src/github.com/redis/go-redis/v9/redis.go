// Package redis is a stub of go-redis v9: the calls the analyzer looks at.
package redis

import (
	"context"
	"time"
)

type Client struct{ cmdable }
type Tx struct{ cmdable }

type cmdable struct{}

type ZRangeBy struct {
	Min, Max      string
	Offset, Count int64
}

type ZRangeArgs struct {
	Key     string
	Start   any
	Stop    any
	ByScore bool
	ByLex   bool
	Rev     bool
	Offset  int64
	Count   int64
}

type StringSliceCmd struct{}

func (StringSliceCmd) Result() ([]string, error) { return nil, nil }
func (StringSliceCmd) Val() []string             { return nil }
func (StringSliceCmd) Err() error                { return nil }

type IntCmd struct{}

func (IntCmd) Result() (int64, error) { return 0, nil }
func (IntCmd) Val() int64             { return 0 }
func (IntCmd) Err() error             { return nil }

type Cmd struct{}

func (Cmd) Result() (any, error) { return nil, nil }

type Script struct{}

func NewScript(string) *Script                                                           { return nil }
func (cmdable) Eval(ctx context.Context, script string, keys []string, args ...any) *Cmd { return nil }
func (cmdable) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *Cmd { return nil }
func (*Script) Run(ctx context.Context, c *Client, keys []string, args ...any) *Cmd      { return nil }

func (cmdable) ZRangeByScore(ctx context.Context, key string, opt *ZRangeBy) *StringSliceCmd {
	return nil
}
func (cmdable) ZRangeArgs(ctx context.Context, z ZRangeArgs) *StringSliceCmd { return nil }
func (cmdable) ZRange(ctx context.Context, key string, start, stop int64) *StringSliceCmd {
	return nil
}
func (cmdable) ZRem(ctx context.Context, key string, members ...any) *IntCmd { return nil }
func (cmdable) ZRemRangeByScore(ctx context.Context, key, min, max string) *IntCmd {
	return nil
}
func (cmdable) ZAdd(ctx context.Context, key string, members ...Z) *IntCmd   { return nil }
func (cmdable) ZAddNX(ctx context.Context, key string, members ...Z) *IntCmd { return nil }
func (cmdable) SAdd(ctx context.Context, key string, members ...any) *IntCmd { return nil }
func (cmdable) ZRangeByScoreWithScores(ctx context.Context, key string, opt *ZRangeBy) *ZSliceCmd {
	return nil
}
func (cmdable) ZAddArgs(ctx context.Context, key string, args ZAddArgs) *IntCmd {
	return nil
}

type ZAddArgs struct {
	NX, XX, LT, GT, Ch bool
	Members            []Z
}

func (cmdable) Do(ctx context.Context, args ...any) *Cmd               { return nil }
func (cmdable) HGet(ctx context.Context, key, field string) *StringCmd { return nil }
func (*Client) Watch(ctx context.Context, fn func(*Tx) error, keys ...string) error {
	return nil
}
func (*Tx) TxPipelined(ctx context.Context, fn func(any) error) error { return nil }

var _ = time.Second

type Z struct {
	Score  float64
	Member any
}

type ZSliceCmd struct{}

func (ZSliceCmd) Val() []Z { return nil }

type StringCmd struct{}

func (StringCmd) Val() string             { return "" }
func (StringCmd) Result() (string, error) { return "", nil }

type BoolCmd struct{}

func (BoolCmd) Val() bool { return false }

type StatusCmd struct{}

type SetArgs struct {
	Mode string
	TTL  time.Duration
}

// Pipeliner is the cmdable of a pipeline.
type Pipeliner interface {
	ZRangeByScore(ctx context.Context, key string, opt *ZRangeBy) *StringSliceCmd
	ZRemRangeByScore(ctx context.Context, key, min, max string) *IntCmd
	ZRem(ctx context.Context, key string, members ...any) *IntCmd
	HDel(ctx context.Context, key string, fields ...string) *IntCmd
	Del(ctx context.Context, keys ...string) *IntCmd
	LPush(ctx context.Context, key string, values ...any) *IntCmd
	ZAdd(ctx context.Context, key string, members ...Z) *IntCmd
	HSet(ctx context.Context, key string, values ...any) *IntCmd
	HIncrBy(ctx context.Context, key, field string, incr int64) *IntCmd
	Exec(ctx context.Context) ([]any, error)
}

func (cmdable) ZRangeWithScores(ctx context.Context, key string, start, stop int64) *ZSliceCmd {
	return nil
}
func (cmdable) LPop(ctx context.Context, key string) *StringCmd { return nil }
func (cmdable) SetNX(ctx context.Context, key string, value any, exp time.Duration) *BoolCmd {
	return nil
}
func (cmdable) SetArgs(ctx context.Context, key string, value any, a SetArgs) *StatusCmd { return nil }
func (*Client) Pipelined(ctx context.Context, fn func(Pipeliner) error) ([]Cmder, error) {
	return nil, nil
}
func (*Client) TxPipelined(ctx context.Context, fn func(Pipeliner) error) ([]Cmder, error) {
	return nil, nil
}

// Cmder is any command's reply.
type Cmder interface{}

func (*Client) TxPipeline() Pipeliner { return nil }
func (*Client) Pipeline() Pipeliner   { return nil }

type MapStringStringCmd struct{}

func (MapStringStringCmd) Val() map[string]string { return nil }

func (cmdable) HGetAll(ctx context.Context, key string) *MapStringStringCmd        { return nil }
func (cmdable) HSet(ctx context.Context, key string, values ...any) *IntCmd        { return nil }
func (cmdable) HIncrBy(ctx context.Context, key, field string, incr int64) *IntCmd { return nil }
func (cmdable) LPush(ctx context.Context, key string, values ...any) *IntCmd       { return nil }
func (cmdable) RPush(ctx context.Context, key string, values ...any) *IntCmd       { return nil }

type FloatCmd struct{}

func (FloatCmd) Val() float64 { return 0 }

func (cmdable) ZScore(ctx context.Context, key, member string) *FloatCmd { return nil }

func (cmdable) Exists(ctx context.Context, keys ...string) *IntCmd           { return nil }
func (cmdable) Del(ctx context.Context, keys ...string) *IntCmd              { return nil }
func (cmdable) Publish(ctx context.Context, channel string, msg any) *IntCmd { return nil }
