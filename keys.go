package zclaim

import (
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// keys are the Redis keys of one schedule. All share the schedule key's
// hash slot so that every script runs on Redis Cluster; job ids are members
// and fields, never parts of key names.
type keys struct {
	schedule string // ZSet: id -> due score
	inflight string // ZSet: id|token -> lease deadline (Unix ms)
	tokens   string // string: fencing token counter
	pending  string // hash: id -> record of the scheduled run
	runs     string // hash: token -> record of a claimed run; "b"+token -> jobs of a batch lease
	batches  string // ZSet: first:n -> deadline of a batch lease (a dispatcher's claim; see prelude.lua)
	dead     string // ZSet: id -> time of death (Unix ms)
	deadInfo string // hash: id -> reason and record
	notice   string // pub/sub channel: an earlier due time was scheduled
	marker   string // string: the state marker (see stateMarker)
	periodic string // hash: name -> periodic definition (see periodic.lua)
	ticks    string // hash: name -> next tick mark of a periodic definition
	sent     string // prefix of the hashes of dispatched jobs, one per time bucket (see broker_sent.go)
	types    map[string]string
	shard    int // which shard of the schedule these keys are (0 of 1 unsharded)
}

// hashTag returns the part of key Redis Cluster hashes, and whether the key
// has a hash tag of its own ({...} with something inside).
func hashTag(key string) (string, bool) {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e], true
		}
	}
	return key, false
}

// deriveKeys names the keys of a schedule. A key with a hash tag keeps it
// ("zclaim:{orders}" -> "zclaim:{orders}:inflight"); a key without one is
// wrapped in braces ("delay:jobs" -> "{delay:jobs}:inflight"), which hashes
// to the same slot as the key itself, so producers keep writing "delay:jobs".
// On Redis Cluster a key whose derived keys would land in another slot
// (a stray empty "{}" in its name) is refused with an error that says how to fix it.
func deriveKeys(key string, cluster bool) (keys, error) {
	base := key
	if _, tagged := hashTag(key); !tagged {
		base = "{" + key + "}"
	}
	k := keys{
		schedule: key,
		inflight: base + ":inflight",
		tokens:   base + ":tokens",
		pending:  base + ":jobs",
		runs:     base + ":runs",
		batches:  base + ":batches",
		dead:     base + ":dead",
		deadInfo: base + ":deadinfo",
		notice:   base + ":notice",
		marker:   base + ":marker",
		periodic: base + ":periodic",
		ticks:    base + ":ticks",
		sent:     base + ":sent:",
	}
	tagSlot := slot(key)
	for _, d := range []string{k.inflight, k.tokens, k.pending, k.runs, k.batches, k.dead, k.deadInfo,
		k.marker, k.periodic, k.ticks} {
		if cluster && slot(d) != tagSlot {
			return keys{}, fmt.Errorf("%w: key %q: the keys derived from it (%q) fall in another Redis Cluster "+
				"slot; give it a hash tag, for example %q",
				ErrInvalidOptions, key, d, "zclaim:{"+strings.NewReplacer("{", "", "}", "").Replace(key)+"}")
		}
	}
	k.types = map[string]string{
		k.schedule: "zset", k.inflight: "zset", k.tokens: "string", k.pending: "hash",
		k.runs: "hash", k.batches: "zset", k.dead: "zset", k.deadInfo: "hash", k.marker: "string",
		k.periodic: "hash", k.ticks: "hash",
	}
	return k, nil
}

// isCluster reports whether rdb spreads keys over Redis Cluster slots.
func isCluster(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.ClusterClient)
	return ok
}

// slot returns the Redis Cluster hash slot of key (CRC16 of its hash tag, mod 16384).
func slot(key string) int {
	tag, _ := hashTag(key)
	return int(crc16(tag) % 16384)
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
