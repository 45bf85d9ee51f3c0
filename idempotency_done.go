package zclaim

// Finished records. A run that completes leaves its run record (a key of
// its own) and becomes one field of a small hash: the field is a 16-byte
// digest of its key, the value the run's lease deadline when it finished
// (no earlier than its finish for a run that held its lease, at most a
// Lease later), and the hash one of DoneBuckets buckets, picked by the
// digest, that Redis keeps as a listpack while it holds at most 128 fields
// (hash-max-listpack-entries): about 32 bytes a record where a key of its
// own costs 210. A lookup is one HGET inside Begin's script. A bucket
// expires Retention + Lease after its last write, and one Complete into it
// in 32, drawn at random, drops its fields past Retention; a field past
// Retention is not done.
//
// On Redis Cluster a bucket must sit in the slot of the run records it
// serves, since one script writes both: a prefix with a hash tag of its own
// puts every key of the store in one slot, and its buckets with them;
// otherwise each slot has DoneBuckets/16384 buckets (at least one) whose
// names carry a hash tag of that slot.

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultDoneBuckets is IdempotencyOptions.DoneBuckets when it is zero and
// the store has recorded none: 65,536 buckets keep up to about 8.4M
// finished records (rate × Retention: 97 runs/s with the default 24h) at
// 32 to 43 bytes each; past that a bucket becomes a hash table, at about
// 90 bytes a record.
const DefaultDoneBuckets = 1 << 16

// maxDoneBuckets bounds IdempotencyOptions.DoneBuckets.
const maxDoneBuckets = 1 << 24

// doneSweepOdds: a Complete drops its bucket's expired fields with odds 1
// in this.
const doneSweepOdds = 32

// doneOf returns the bucket and field of key's finished record.
func (i *Idempotency) doneOf(key string) (bucket, field string) {
	d := i.digest(key)
	b := strconv.FormatUint(uint64(binary.BigEndian.Uint32(d[16:20])%uint32(i.doneSub)), 10)
	if i.doneTagged {
		return i.opts.Prefix + doneInfix + ":" + b, string(d[:16])
	}
	return i.opts.Prefix + doneInfix + ":{" + slotTags()[slot(i.recordKey(key))] + "}" + b, string(d[:16])
}

// digestSHA1 follows the number of buckets a store records when its
// records are digested with SHA-1 (see digest).
const digestSHA1 = " sha1"

// digest is the digest of key that names its finished record: its first 16
// bytes are the field, the 4 after them pick the bucket. A store made by
// this version digests with SHA-1, which its dequeue script reaches in
// Redis (redis.sha1hex: half a microsecond where SHA-256 written in Lua
// takes about 40); one that recorded its number of buckets without
// digestSHA1 was written with SHA-256, and keeps it. Either holds 128 bits
// of a field: only a key chosen to match another one the same chooser
// chose (a collision, about 2^61 SHA-1 steps) could share a record, and
// no key can be made to match a given one.
func (i *Idempotency) digest(key string) [32]byte {
	if i.doneSHA1 {
		var d [32]byte
		s := sha1.Sum([]byte(key))
		copy(d[:], s[:])
		return d
	}
	return sha256.Sum256([]byte(key))
}

// slotTags returns, for each Redis Cluster slot, a short string whose
// CRC16 falls in it: "{" + slotTags()[s] + "}" puts a key in slot s.
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, 16384)
	for n, left := 0, len(tags); left > 0; n++ {
		t := strconv.FormatInt(int64(n), 36)
		if s := crc16(t) % 16384; tags[s] == "" {
			tags[s] = t
			left--
		}
	}
	return tags
})

// checkDoneOptions checks the options of the finished records.
func (i *Idempotency) checkDoneOptions() error {
	p := i.opts.Prefix
	if s := strings.IndexByte(p, '{'); s >= 0 {
		if _, tagged := hashTag(p); !tagged {
			return fmt.Errorf("%w: Prefix %q opens a hash tag it does not close, or leaves it empty: "+
				"the slot of each record would depend on its key in ways its finished records cannot follow",
				ErrInvalidOptions, p)
		}
		i.doneTagged = true
	}
	if n := i.opts.DoneBuckets; n < 0 || n > maxDoneBuckets {
		return fmt.Errorf("%w: DoneBuckets must be from 1 to %d, not %d", ErrInvalidOptions, maxDoneBuckets, n)
	}
	return nil
}

// readyDone readies the store once: it settles its number of buckets
// (setupDone) and loads the scripts of its runs (loadScripts). Until it
// could, it tries again at each call, and the store's calls fail with its
// error (a server that cannot be reached, a user without access to the
// prefix).
func (i *Idempotency) readyDone(ctx context.Context) error {
	if i.doneReady.Load() {
		return nil
	}
	i.doneMu.Lock()
	defer i.doneMu.Unlock()
	if i.doneReady.Load() {
		return nil
	}
	if err := i.setupDone(ctx); err != nil {
		return err
	}
	i.loadScripts(ctx)
	i.doneReady.Store(true)
	return nil
}

// setupDone settles the store's number of buckets: the one its records
// were written with (recorded at Prefix + doneInfix), else DoneBuckets
// or DefaultDoneBuckets, recorded then. A DoneBuckets other than the
// recorded number is refused: its lookups would miss the records written
// before, and their work would run again.
func (i *Idempotency) setupDone(ctx context.Context) error {
	p := i.opts.Prefix
	want := i.opts.DoneBuckets
	n := want
	if n == 0 {
		n = DefaultDoneBuckets
	}
	old, err := i.rdb.SetArgs(ctx, p+doneInfix, strconv.Itoa(n)+digestSHA1, redis.SetArgs{Mode: "NX", Get: true}).Result()
	useSHA1 := true
	switch {
	case err == redis.Nil:
	case err != nil:
		return wrap(ctx, "idempotency store: record the number of buckets", err, nil)
	default:
		num, s1 := strings.CutSuffix(old, digestSHA1)
		rec, perr := strconv.Atoi(num)
		if perr != nil || rec < 1 || rec > maxDoneBuckets {
			return zerr("zclaim: idempotency store: %w: %q holds %q, not a number of buckets",
				ErrCorrupt, p+doneInfix, old)
		}
		if want != 0 && want != rec {
			return fmt.Errorf("%w: DoneBuckets %d, but this store's finished records were written with %d "+
				"(%q): a store that looked elsewhere would run their work again", ErrInvalidOptions, want, rec, p+doneInfix)
		}
		n, useSHA1 = rec, s1
	}
	i.doneBuckets, i.doneSHA1 = n, useSHA1
	i.doneSub = n
	if !i.doneTagged {
		i.doneSub = max(1, (n+16383)/16384)
	}
	return nil
}

// loadScripts sends the scripts of every run to Redis (every node of a
// cluster), so that the calls of the store's first moment do not each
// meet NOSCRIPT and send their script again whole. Best effort: a script
// not loaded (an ACL without SCRIPT LOAD, a server restarted since, a node
// that does not answer within loadScriptsFor) is sent whole at its first
// call, as any.
func (i *Idempotency) loadScripts(ctx context.Context) {
	// A cluster's node that is down or cut off would hold the load, and
	// with it the store's start or first call, for go-redis' dial timeouts
	// and retries.
	ctx, cancel := context.WithTimeout(ctx, loadScriptsFor)
	defer cancel()
	for _, s := range []*redis.Script{i.begin, i.complete, dequeueScript} {
		if s != nil {
			_ = s.Load(ctx, i.rdb).Err()
		}
	}
}

// loadScriptsFor bounds loadScripts.
const loadScriptsFor = 500 * time.Millisecond
