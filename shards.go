package zclaim

// Shards: a schedule spread over hash tags of its own (BrokerOptions.Shards),
// which job goes to which, the count recorded with the schedule, and the
// scripts sent to every shard (or some) in one pipeline.

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxShards bounds BrokerOptions.Shards.
const MaxShards = 1024

// shardKeys names the keys of a schedule of n shards. One shard is the
// schedule key itself (deriveKeys). With n > 1, shard i is a schedule of
// its own whose hash tag is the key's tag (or the key) followed by
// "/<i>.<k>", with the smallest k that puts the tag's slot within a
// quarter of a shard's width of the centre of the i-th n-th of the 16,384
// slots: the shards spread evenly over the slot space, and so over the
// masters of a cluster whose masters hold equal ranges
// ("zclaim:{orders}" -> "zclaim:{orders/3.17}").
func shardKeys(key string, n int, cluster bool) ([]*keys, error) {
	if n == 1 {
		k, err := deriveKeys(key, cluster)
		return []*keys{&k}, err
	}
	tag, tagged := hashTag(key)
	out := make([]*keys, n)
	w := max(1, 16384/(4*n)) // half the width of the window around a shard's centre
	for i := range n {
		centre := (2*i + 1) * 16384 / (2 * n)
		var st string
		for k := 0; ; k++ {
			st = tag + "/" + strconv.Itoa(i) + "." + strconv.Itoa(k)
			if s := int(crc16(st) % 16384); s >= centre-w && s < centre+w {
				break
			}
		}
		sk := "{" + st + "}"
		if tagged {
			open := strings.IndexByte(key, '{')
			sk = key[:open] + sk + key[open+len(tag)+2:]
		}
		k, err := deriveKeys(sk, cluster)
		if err != nil {
			return nil, err
		}
		k.shard = i
		out[i] = &k
	}
	return out, nil
}

// shardOf returns the shard of job id in a schedule of n shards: FNV-1a
// (32 bits) of the id, modulo n.
func shardOf(id string, n int) int {
	if n == 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// shardSet is a Redis client and the keys of a schedule's shards: how the
// Broker's scripts reach every shard, each in its own slot, writes waiting
// for replicas where asked (repl).
type shardSet struct {
	rdb    redis.UniversalClient
	shards []*keys // every shard's, by index
	repl   replication
}

// byShard calls f once for each shard that ids fall in, with its ids in
// their order (with one shard: once, with all of them).
func (b *shardSet) byShard(ids []string, f func(k *keys, ids []string) error) error {
	if len(b.shards) == 1 {
		return f(b.shards[0], ids)
	}
	groups := make([][]string, len(b.shards))
	for _, id := range ids {
		i := shardOf(id, len(b.shards))
		groups[i] = append(groups[i], id)
	}
	for i, g := range groups {
		if len(g) > 0 {
			if err := f(b.shards[i], g); err != nil {
				return err
			}
		}
	}
	return nil
}

// shardOf returns the keys of id's shard.
func (b *shardSet) shardOf(id string) *keys { return b.shards[shardOf(id, len(b.shards))] }

// shardRecord names the string that records a schedule's shard count,
// beside the unsharded schedule's keys ("{delay:jobs}:shards").
func shardRecord(key string) string {
	one, _ := deriveKeys(key, false)
	return strings.TrimSuffix(one.marker, ":marker") + ":shards"
}

// recordedShards returns the shard count recorded with the schedule at
// key: 1 when there is none, or it cannot be read (recordShards then says so).
func recordedShards(rdb redis.UniversalClient, key string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := rdb.Get(ctx, shardRecord(key)).Int()
	if err != nil || n < 1 || n > MaxShards {
		return 1
	}
	return n
}

// notice is the argument that names k's notice channel to a script: on
// Redis Cluster "s|" before it, and the script publishes it with SPUBLISH
// (sharded pub/sub, to the node of its slot only).
func (b *shardSet) notice(k *keys) string {
	if isCluster(b.rdb) {
		return "s|" + k.notice
	}
	return k.notice
}

// eachShard runs script s, a read, on every shard of the schedule, with
// the keys and arguments args gives for each, in one pipeline: one round
// trip per node. It returns each shard's reply, by shard.
func (b *shardSet) eachShard(ctx context.Context, s *redis.Script, args func(k *keys) ([]string, []any)) []*redis.Cmd {
	return b.pipelined(ctx, s, b.shards, args)
}

// writeShards runs script s, a write, on shards: in one pipeline, or shard
// by shard where writes wait for replicas (WAIT counts the writes of its
// own connection, on each shard's node). It returns the replies in the
// shards' order.
func (b *shardSet) writeShards(ctx context.Context, s *redis.Script, shards []*keys,
	args func(k *keys) ([]string, []any)) []*redis.Cmd {
	if len(shards) > 1 && b.repl.n == 0 {
		return b.pipelined(ctx, s, shards, args)
	}
	cmds := make([]*redis.Cmd, len(shards))
	for i, k := range shards {
		keys, a := args(k)
		cmds[i] = b.repl.run(ctx, b.rdb, s, keys, a...)
	}
	return cmds
}

// pipelined sends s to each of shards in one pipeline (pipelinedScripts).
func (b *shardSet) pipelined(ctx context.Context, s *redis.Script, shards []*keys,
	args func(k *keys) ([]string, []any)) []*redis.Cmd {
	return pipelinedScripts(ctx, b.rdb, len(shards), func(i int) (*redis.Script, []string, []any) {
		keys, a := args(shards[i])
		return s, keys, a
	})
}

// neverRan gives the commands of a pipeline that never ran (its
// connection could not be made or authenticated: WRONGPASS, NOAUTH), which
// are left without a reply or an error, the pipeline's error perr.
func neverRan(perr error, cmds ...*redis.Cmd) {
	for _, c := range cmds {
		if perr != nil && c.Err() == nil && c.Val() == nil {
			c.SetErr(perr)
		}
	}
}

// pipelinedScripts sends n script calls in one pipeline, call(i) naming
// the i-th's script, keys and arguments, and returns their replies in
// order. A call refused before it ran (NOSCRIPT: the node lacks the
// script; or retryable) is sent again, alone, with the script's body.
func pipelinedScripts(ctx context.Context, rdb redis.UniversalClient, n int,
	call func(i int) (*redis.Script, []string, []any)) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	_, perr := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			s, keys, a := call(i)
			cmds[i] = s.EvalSha(ctx, p, keys, a...)
		}
		return nil
	})
	neverRan(perr, cmds...)
	for i := range cmds {
		if err := cmds[i].Err(); redis.HasErrorPrefix(err, "NOSCRIPT") || retryable(err) {
			s, keys, a := call(i)
			cmds[i] = replication{}.run(ctx, rdb, s, keys, a...)
		}
	}
	return cmds
}
