// Package rueidiscompat is the part of rueidis' go-redis-like adapter the
// tests use.
package rueidiscompat

import "context"

type ZRangeBy struct{ Min, Max string }

type StringSliceCmd struct{}

func (StringSliceCmd) Val() []string { return nil }

type IntCmd struct{}

func (IntCmd) Val() int64 { return 0 }

type Compat struct{}

func (Compat) ZRangeByScore(ctx context.Context, key string, opt ZRangeBy) StringSliceCmd {
	return StringSliceCmd{}
}
func (Compat) ZRem(ctx context.Context, key string, members ...any) IntCmd { return IntCmd{} }

type Cmd struct{}

func (Cmd) Val() any { return nil }

func (Compat) Do(ctx context.Context, args ...any) Cmd { return Cmd{} }

func (Compat) LPush(ctx context.Context, key string, values ...any) IntCmd { return IntCmd{} }
