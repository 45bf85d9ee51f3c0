package zclaim

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// forget deletes key's run record and finished record, as a server that
// lost them would.
func forget(t testing.TB, rdb redis.UniversalClient, i *Idempotency, key string) {
	t.Helper()
	bucket, field := i.doneOf(key)
	must(t, rdb.Del(ctx, i.recordKey(key)).Err())
	must(t, rdb.HDel(ctx, bucket, field).Err())
}

// A finished run leaves no run record: its finish is one field of a small
// hash that Redis keeps as a listpack. Begin finds it for Retention past
// the run's lease deadline and not after; the bucket expires Retention +
// Lease after its last write, and a sweep drops the fields past Retention.
func TestDoneRecordsCompact(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// Two stores on one prefix: one that keeps records a minute, and one
	// that keeps them 150 ms, for their expiry; leases of 50 ms.
	const lease = 50 * time.Millisecond
	i := newIdem(t, rdb, IdempotencyOptions{Lease: lease, Retention: time.Minute, DoneBuckets: 1})
	short := newIdem(t, rdb, IdempotencyOptions{Prefix: i.Prefix(), Lease: lease, Retention: 150 * time.Millisecond})
	short.sweepOdds = 1 // every Complete sweeps
	finish := func(k string) {
		t.Helper()
		e, err := i.Begin(ctx, k)
		must(t, err)
		must(t, e.Complete(ctx))
	}
	for n := range 50 {
		finish(fmt.Sprint("k", n))
	}
	bucket, _ := i.doneOf("k0")
	if enc := rdb.ObjectEncoding(ctx, bucket).Val(); enc != "listpack" {
		t.Fatalf("bucket encoding %q", enc)
	}
	if n := rdb.HLen(ctx, bucket).Val(); n != 50 {
		t.Fatalf("bucket holds %d records, want 50", n)
	}
	if ttl := rdb.PTTL(ctx, bucket).Val(); ttl <= 0 || ttl > time.Minute+lease {
		t.Fatalf("bucket TTL %v", ttl)
	}
	if n, _ := rdb.Exists(ctx, i.recordKey("k0"), i.recordKey("k49")).Result(); n != 0 {
		t.Fatalf("%d finished runs kept their run records", n)
	}
	for n := range 50 {
		if _, err := i.Begin(ctx, fmt.Sprint("k", n)); !errors.Is(err, ErrAlreadyDone) {
			t.Fatalf("k%d after Complete: %v", n, err)
		}
	}
	// Past Retention (from the lease deadline) a record is not done,
	// whether or not swept yet...
	time.Sleep(150*time.Millisecond + lease + 30*time.Millisecond)
	// ...and the next Complete's sweep drops the other 49. The run's record
	// lives Lease + Retention (200 ms), and so does the bucket after the
	// Complete: on a machine so loaded that the Complete, or the count
	// after it, comes later, the record or the bucket is gone, and the run
	// starts over.
	startOver(t, 3, func(int) (fault, excuse string) {
		began := time.Now()
		e, err := short.Begin(ctx, "k0")
		must(t, err)
		err = e.Complete(ctx)
		n := int64(-1)
		if err == nil {
			if n = rdb.HLen(ctx, bucket).Val(); n == 1 {
				return "", ""
			}
		}
		took := time.Since(began)
		fault = fmt.Sprintf("%v after its Begin: complete k0: %v; then the bucket holds %d records, want 1", took, err, n)
		if err != nil && !errors.Is(err, ErrLeaseLost) || took < lease+150*time.Millisecond {
			return fault, ""
		}
		return fault, "past the short store's Lease + Retention"
	})
	// Nothing written: the bucket expires on its own.
	time.Sleep(150*time.Millisecond + lease + 30*time.Millisecond)
	if n, _ := rdb.Exists(ctx, bucket).Result(); n != 0 {
		t.Fatal("the bucket outlived its retention")
	}
}

// With the default odds, about one Complete in doneSweepOdds sweeps its
// bucket: a field long past its retention, put back after each sweep,
// goes 30 times in 960 Completes on average. Fewer than 3 or more than
// 100 sweeps come by chance with odds below 1 in 10^10; a Complete that
// swept every time, or never, fails.
func TestDoneSweepOdds(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{DoneBuckets: 1})
	bucket, _ := i.doneOf("k0")
	const n = 960
	sweeps := 0
	must(t, rdb.HSet(ctx, bucket, "old", 1).Err())
	for k := range n {
		e, err := i.Begin(ctx, fmt.Sprint("k", k))
		must(t, err)
		must(t, e.Complete(ctx))
		if rdb.HExists(ctx, bucket, "old").Val() {
			continue
		}
		sweeps++
		must(t, rdb.HSet(ctx, bucket, "old", 1).Err())
	}
	if sweeps < 3 || sweeps > 100 {
		t.Fatalf("%d of %d Completes swept their bucket, where 1 in %d do on average", sweeps, n, doneSweepOdds)
	}
	t.Logf("%d of %d Completes swept", sweeps, n)
}

// The number of buckets is recorded with the store's records at its first
// start: zero adopts it, another number is refused, and so is a prefix
// whose hash tag the buckets could not follow.
func TestDoneBucketsRecorded(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	prefix := testKey(t) + ":run:"
	i := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, DoneBuckets: 8})
	if i.doneBuckets != 8 || i.doneSub != 8 {
		t.Fatalf("buckets %d, per slot %d", i.doneBuckets, i.doneSub)
	}
	i2 := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix})
	if i2.doneBuckets != 8 {
		t.Fatalf("a store with DoneBuckets 0 took %d, not the recorded 8", i2.doneBuckets)
	}
	quiet := slog.New(slog.DiscardHandler)
	_, err := NewIdempotency(rdb, IdempotencyOptions{Prefix: prefix, DoneBuckets: 16, Logger: quiet})
	wantErr(t, err, ErrInvalidOptions)
	for _, p := range []string{"zt:{" + t.Name() + ":run:", "zt:{}" + t.Name() + ":run:"} {
		_, err = NewIdempotency(rdb, IdempotencyOptions{Prefix: p, Logger: quiet})
		wantErr(t, err, ErrInvalidOptions)
	}
	_, err = NewIdempotency(rdb, IdempotencyOptions{Prefix: prefix, DoneBuckets: -1, Logger: quiet})
	wantErr(t, err, ErrInvalidOptions)

	// Without a hash tag each slot has its buckets: DoneBuckets / 16384.
	untagged := "zt-" + t.Name() + ":run:"
	t.Cleanup(func() { rdb.Del(ctx, untagged+doneInfix) })
	u := newIdem(t, rdb, IdempotencyOptions{Prefix: untagged, DoneBuckets: 1 << 16})
	if u.doneSub != 4 {
		t.Fatalf("per slot %d, want 4", u.doneSub)
	}
	for _, k := range []string{"a", "order-731@2026-12-01T08:00:00.000Z", "x{y}z"} {
		if b, _ := u.doneOf(k); slot(b) != slot(untagged+k) {
			t.Fatalf("bucket %q of %q in slot %d, its run record in %d", b, k, slot(b), slot(untagged+k))
		}
	}
}

// A store made now digests its keys with SHA-1 and records so beside its
// number of buckets; one whose number was recorded alone (by an earlier
// version) digests with SHA-256, finds the records written so, and
// begins no runs in asynq's dequeue; a record it cannot read is refused.
func TestDoneDigestRecorded(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	prefix := testKey(t) + ":run:"
	i := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, DoneBuckets: 8})
	d1 := sha1.Sum([]byte("k"))
	if v := rdb.Get(ctx, prefix+doneInfix).Val(); v != "8 sha1" || !i.doneSHA1 {
		t.Fatalf("recorded %q (SHA-1: %t)", v, i.doneSHA1)
	}
	if _, field := i.doneOf("k"); field != string(d1[:16]) {
		t.Fatalf("field %x, want SHA-1's %x", field, d1[:16])
	}

	old := testKey(t) + "-old:run:"
	must(t, rdb.Set(ctx, old+doneInfix, "8", 0).Err())
	o := newIdem(t, rdb, IdempotencyOptions{Prefix: old})
	if o.doneSHA1 || o.doneBuckets != 8 {
		t.Fatalf("a store of SHA-256 records: SHA-1 %t, %d buckets", o.doneSHA1, o.doneBuckets)
	}
	d := sha256.Sum256([]byte("k"))
	bucket := old + doneInfix + ":" + strconv.Itoa(int(binary.BigEndian.Uint32(d[16:20])%8))
	must(t, rdb.HSet(ctx, bucket, string(d[:16]), time.Now().Add(time.Hour).UnixMilli()).Err())
	if _, err := o.Begin(ctx, "k"); !errors.Is(err, ErrAlreadyDone) {
		t.Errorf("Begin of a key an earlier version finished: %v, want ErrAlreadyDone", err)
	}

	bad := testKey(t) + "-bad:run:"
	must(t, rdb.Set(ctx, bad+doneInfix, "8 md5", 0).Err())
	_, err := NewIdempotency(rdb, IdempotencyOptions{Prefix: bad, Logger: slog.New(slog.DiscardHandler)})
	wantErr(t, err, ErrCorrupt)
}

// Keys of the store's own form are refused; a bucket of another type is
// reported by name and nothing is written; a finished record written by
// an earlier version (a "done" run record) is still done.
func TestDoneRecordsBadInput(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{DoneBuckets: 1})
	_, err := i.Begin(ctx, doneInfix+":0")
	wantErr(t, err, ErrReservedKey)

	bucket, _ := i.doneOf("k")
	must(t, rdb.Set(ctx, bucket, "x", 0).Err())
	_, err = i.Begin(ctx, "k")
	var wt *WrongTypeError
	if !errors.As(err, &wt) || wt.Key != bucket || wt.Got != "string" {
		t.Fatalf("begin with a string bucket: %v", err)
	}
	if n, _ := rdb.Exists(ctx, i.recordKey("k")).Result(); n != 0 {
		t.Fatal("a refused Begin wrote its run record")
	}
	must(t, rdb.Del(ctx, bucket).Err())
	e, err := i.Begin(ctx, "k")
	must(t, err)
	must(t, rdb.Set(ctx, bucket, "x", 0).Err())
	err = e.Complete(ctx)
	if !errors.As(err, &wt) || wt.Key != bucket {
		t.Fatalf("complete with a string bucket: %v", err)
	}
	if rec := rdb.Get(ctx, i.recordKey("k")).Val(); rec == "" {
		t.Fatal("a refused Complete deleted its run record")
	}
	must(t, rdb.Del(ctx, bucket).Err())

	must(t, rdb.Set(ctx, i.recordKey("old"), "done 12 0", time.Minute).Err())
	_, err = i.Begin(ctx, "old")
	wantErr(t, err, ErrAlreadyDone)
}
