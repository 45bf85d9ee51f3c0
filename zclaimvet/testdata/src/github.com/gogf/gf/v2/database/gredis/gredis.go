// Package gredis stands in for GoFrame's gredis: Do, and the sorted-set
// group of Redis' methods.
package gredis

import (
	"context"

	"github.com/gogf/gf/v2/container/gvar"
)

type ZRangeOptionLimit struct{ Offset, Count *int }

type ZRangeOption struct {
	ByScore    bool
	ByLex      bool
	Rev        bool
	Limit      *ZRangeOptionLimit
	WithScores bool
}

type IGroupSortedSet interface {
	ZScore(ctx context.Context, key string, member interface{}) (float64, error)
	ZRange(ctx context.Context, key string, start, stop int64, option ...ZRangeOption) (gvar.Vars, error)
	ZRem(ctx context.Context, key string, member interface{}, members ...interface{}) (int64, error)
	ZRemRangeByRank(ctx context.Context, key string, start, stop int64) (int64, error)
	ZRemRangeByScore(ctx context.Context, key string, min, max string) (int64, error)
}

type IGroupList interface {
	LPop(ctx context.Context, key string, count ...int) (*gvar.Var, error)
	RPop(ctx context.Context, key string, count ...int) (*gvar.Var, error)
}

type IGroupString interface {
	SetNX(ctx context.Context, key string, value interface{}) (bool, error)
}

type localGroupSortedSet = IGroupSortedSet
type localGroupList = IGroupList
type localGroupString = IGroupString

type Redis struct {
	localGroupSortedSet
	localGroupList
	localGroupString
}

func (r *Redis) Do(ctx context.Context, command string, args ...interface{}) (*gvar.Var, error) {
	return nil, nil
}
