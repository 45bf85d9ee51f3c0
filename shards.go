package zclaim

// Shards: a schedule spread over hash tags of its own (BrokerOptions.Shards),
// which job goes to which, and the count recorded with the schedule.

import (
	"context"
	"log/slog"
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

// ShardKey returns the schedule key of the shard that holds job id: the
// key itself with one shard; with Shards, that of id's shard, whose hash
// slot says which Redis Cluster master holds the job.
func (b *Broker) ShardKey(id string) string { return b.shardOf(id).schedule }

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

// recordShards records the shard count with the schedule, or checks it
// against the one recorded: in a string beside the unsharded schedule's
// keys ("{delay:jobs}:shards"), written only for more than one shard. A
// count that differs is refused; so is a sharded schedule on a key that
// holds a set already (producers writing it would never be read).
func (b *Broker) recordShards() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec := shardRecord(b.opts.Key)
	n := strconv.Itoa(len(b.shards))
	if len(b.shards) > 1 {
		if exists, err := b.rdb.Exists(ctx, b.opts.Key).Result(); err == nil && exists == 1 {
			return zerr("zclaim: %w: key %q holds a set already; only Shards 1 adopts an existing set "+
				"(docs/broker.md, Redis Cluster)", ErrShards, b.opts.Key)
		}
		b.rdb.SetNX(ctx, rec, n, 0)
	}
	got, err := b.rdb.Get(ctx, rec).Result()
	switch {
	case err == redis.Nil:
		got = "1"
	case err != nil:
		b.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not read the schedule's shard count",
			slog.String("key", rec), slog.String("error", err.Error()))
		return nil
	}
	if got != n {
		return zerr("zclaim: %w: the schedule %q has %s shards, not %s; open it with Shards %s (docs/operations.md "+
			"says how to change the count)",
			ErrShards, b.opts.Key, got, n, got)
	}
	return nil
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
