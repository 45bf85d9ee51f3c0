package zclaim

import (
	"bytes"
	"errors"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// What the broker reads back from Redis may have been written by someone
// else (an adopted key) or damaged: decoding returns ErrCorrupt, never panics.

func FuzzDecodeRecord(f *testing.F) {
	f.Add("0:")
	f.Add("3:")
	f.Add("0:" + encodeRest("email", "critical", []byte("payload"), nil))
	f.Add("12:" + encodeRest("", "", []byte{0, 1, 2}, nil))
	f.Add("0:19zz")
	f.Add("x:1")
	f.Add("0:1999999999:")
	f.Add("2@1787991500.25:" + encodeRest("t", "q", []byte("p"), nil))
	f.Add("0:" + encodeRest("t", "q", []byte("p"), map[string]string{"traceparent": "00-ab-cd-01", "b": ""}))
	f.Add("0:21:t1:q2:1:a1:b1:c1:dp")
	f.Add("0@:")
	f.Fuzz(func(t *testing.T, rec string) {
		var j Job
		a, _, err := decodeRecord(rec, &j)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%q: error %v does not match ErrCorrupt", rec, err)
			}
			return
		}
		if a < 0 {
			t.Fatalf("%q: attempts %d", rec, a)
		}
		// What decodes re-encodes to the same record.
		if re := encodeRest(j.Type, j.Queue, j.Payload, j.Headers); rec[len(rec)-len(re):] != re {
			t.Fatalf("%q decoded to %+v, which encodes as %q", rec, j, re)
		}
	})
}

func FuzzEncodeDecode(f *testing.F) {
	f.Add("email", "default", []byte("x"), uint16(3), int64(1787991500250), "", "")
	f.Add("", "", []byte{}, uint16(0), int64(-1), "traceparent", "00-1-2-01")
	f.Add("a:b", "1:2", []byte("9:zz"), uint16(7), int64(0), "2:", ":3")
	f.Fuzz(func(t *testing.T, typ, queue string, payload []byte, attempts uint16, dueMs int64, hk, hv string) {
		var headers map[string]string
		if hk != "" {
			headers = map[string]string{hk: hv, hk + "x": hv}
		}
		rec := encodeRest(typ, queue, payload, headers)
		due := strconv.FormatInt(dueMs, 10)
		var j Job
		a, gotDue, err := decodeRecord(itoa(int(attempts))+"@"+due+":"+rec, &j)
		if err != nil {
			t.Fatal(err)
		}
		if a != int(attempts) || gotDue != due || j.Type != typ || j.Queue != queue || !bytes.Equal(j.Payload, payload) ||
			!maps.Equal(j.Headers, headers) {
			t.Fatalf("round trip of %q %q %q %d %s gave %+v %d %s", typ, queue, payload, attempts, due, j, a, gotDue)
		}
	})
}

func FuzzDecodeDeadInfo(f *testing.F) {
	f.Add("13:lease expired3:" + encodeRest("t", "", []byte("p"), nil))
	f.Add("0:0:")
	f.Add("99:short")
	f.Fuzz(func(t *testing.T, info string) {
		var j Job
		if _, _, _, err := decodeDeadInfo(info, &j); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%q: %v", info, err)
		}
	})
}

// A run record written by someone else: Begin and the settle calls answer
// with an error (ErrCorrupt, ErrWrongType) or a valid result, never a panic
// or a Lua error that is not the package's.
func FuzzRunRecord(f *testing.F) {
	f.Add("run 17 1")
	f.Add("done x ")
	f.Add("free 1e400 -5")
	f.Add("run 9007199254740993 1")
	f.Add("")
	rdb := newClient(f)
	i := newIdem(f, rdb, IdempotencyOptions{})
	f.Fuzz(func(t *testing.T, rec string) {
		rk := i.recordKey("fuzz")
		rdb.Del(ctx, rk)
		if rec != "" {
			must(t, rdb.Set(ctx, rk, rec, 0).Err())
		}
		e, err := i.Begin(ctx, "fuzz")
		switch {
		case err == nil:
			if e.Token <= 0 {
				t.Fatalf("token %d", e.Token)
			}
			if err := e.Complete(ctx); err != nil {
				t.Fatalf("complete after begin: %v", err)
			}
		case errors.Is(err, ErrCorrupt), errors.Is(err, ErrAlreadyDone), errors.Is(err, ErrInProgress):
		default:
			t.Fatalf("record %q: %v", rec, err)
		}
	})
}

// The record of a batch lease (the jobs of a dispatcher's claim), damaged
// or written by someone else: recovery and settling read what they can
// and never fail with a Lua error, hang, or schedule an empty id (an empty
// member goes to the dead set).
func FuzzBatchRecord(f *testing.F) {
	f.Add("1:a0:1:b5:2:xyz")
	f.Add("3:abc12:0:t/q/payload")
	f.Add("-1:a0:")
	f.Add("99999999999999999999:a0:")
	f.Add("0:0:")
	f.Add("")
	b := newBroker(f, BrokerOptions{Lease: time.Minute, Backoff: func(int) time.Duration { return 0 }})
	past := float64(time.Now().Add(-time.Hour).UnixMilli())
	f.Fuzz(func(t *testing.T, blob string) {
		must(t, b.rdb.Del(ctx, b.keys.schedule, b.keys.batches, b.keys.runs, b.keys.pending, b.keys.dead, b.keys.deadInfo).Err())
		must(t, b.rdb.ZAdd(ctx, b.keys.batches, redis.Z{Score: past, Member: "7:3"}).Err())
		must(t, b.rdb.HSet(ctx, b.keys.runs, "b7", blob, "batched", 3).Err())
		if _, err := b.Recover(ctx); err != nil {
			t.Fatalf("recover %q: %v", blob, err)
		}
		ids, err := b.rdb.ZRange(ctx, b.keys.schedule, 0, -1).Result()
		must(t, err)
		for _, id := range ids {
			if id == "" {
				t.Fatalf("recover %q scheduled an empty id", blob)
			}
		}
		if n, _ := b.rdb.ZCard(ctx, b.keys.batches).Result(); n != 0 {
			t.Fatalf("recover %q left the lease", blob)
		}
		must(t, b.rdb.ZAdd(ctx, b.keys.batches, redis.Z{Score: past, Member: "7:3"}).Err())
		must(t, b.rdb.HSet(ctx, b.keys.runs, "b7", blob).Err())
		lost, err := b.finishBatches(ctx, batchEnd{lease: batchLease{first: 7, n: 3},
			retry: map[int]time.Duration{1: 0}, dead: map[int]string{2: "x"}})
		if err != nil || len(lost) != 0 {
			t.Fatalf("finish %q: %v %v", blob, lost, err)
		}
	})
}

func itoa(n int) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
