// Package rueidis is the part of rueidis' API the tests use: the client's
// command builder, Do, DoMulti, Dedicated and the reply.
package rueidis

import "context"

type Completed struct{}

type Commands []Completed

type RedisResult struct{}

func (RedisResult) Error() error                     { return nil }
func (RedisResult) AsStrSlice() ([]string, error)    { return nil, nil }
func (RedisResult) AsInt64() (int64, error)          { return 0, nil }
func (RedisResult) AsBool() (bool, error)            { return false, nil }
func (RedisResult) ToArray() ([]RedisMessage, error) { return nil, nil }

type RedisMessage struct{}

func (RedisMessage) ToString() (string, error) { return "", nil }

type Client interface {
	B() Builder
	Do(ctx context.Context, cmd Completed) RedisResult
	DoMulti(ctx context.Context, multi ...Completed) []RedisResult
	Dedicated(fn func(DedicatedClient) error) error
}

// DedicatedClient is one connection, for WATCH and the like.
type DedicatedClient interface {
	B() Builder
	Do(ctx context.Context, cmd Completed) RedisResult
	DoMulti(ctx context.Context, multi ...Completed) []RedisResult
}

type Builder struct{}

// Step stands for the builder's typed steps.
type Step struct{}

func (Builder) Zrangebyscore() Step    { return Step{} }
func (Builder) Zrange() Step           { return Step{} }
func (Builder) Zrem() Step             { return Step{} }
func (Builder) Zremrangebyscore() Step { return Step{} }
func (Builder) Set() Step              { return Step{} }
func (Builder) Lpop() Step             { return Step{} }
func (Builder) Del() Step              { return Step{} }
func (Builder) Mget() Step             { return Step{} }
func (Builder) Lpush() Step            { return Step{} }
func (Builder) Multi() Step            { return Step{} }
func (Builder) Exec() Step             { return Step{} }
func (Builder) Watch() Step            { return Step{} }
func (Builder) Zadd() Step             { return Step{} }

func (Step) Key(...string) Step      { return Step{} }
func (Step) Min(string) Step         { return Step{} }
func (Step) Max(string) Step         { return Step{} }
func (Step) Limit(int64, int64) Step { return Step{} }
func (Step) Byscore() Step           { return Step{} }
func (Step) Member(...string) Step   { return Step{} }
func (Step) Value(string) Step       { return Step{} }
func (Step) Nx() Step                { return Step{} }
func (Step) Element(...string) Step  { return Step{} }
func (Step) Build() Completed        { return Completed{} }

// ScoreMember stands for both of ZADD's steps: ScoreMember() and
// ScoreMember(score, member).
func (Step) ScoreMember(...any) Step { return Step{} }

// Lua is a script, run with Exec.
type Lua struct{}

func NewLuaScript(string) *Lua { return nil }
func (*Lua) Exec(ctx context.Context, c Client, keys, args []string) RedisResult {
	return RedisResult{}
}
