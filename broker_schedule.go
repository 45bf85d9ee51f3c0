package zclaim

// Putting jobs on the schedule, moving them and taking them off: Schedule,
// Cancel, RunNow, Reschedule, CancelMany.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"
)

// badHeaders says why asynq could not carry headers h, or "".
func badHeaders(h map[string]string) string {
	for k, v := range h {
		switch {
		case k == "":
			return "a header with an empty name"
		case strings.HasPrefix(k, "zclaim-"):
			return fmt.Sprintf("header %q: names beginning with \"zclaim-\" are the dispatcher's", k)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return fmt.Sprintf("header %q: not valid UTF-8", k)
		}
	}
	return ""
}

func validateJob(j *Job) error {
	switch {
	case j.ID == "":
		return ErrEmptyID
	case len(j.ID) > MaxIDLen:
		return ErrIDTooLong
	case strings.HasPrefix(j.ID, PeriodicPrefix):
		return ErrReservedID
	case unfitForAsynq(j.ID, j.Type, j.Queue) != "":
		return fmt.Errorf("%w: %s", ErrUnfitForAsynq, unfitForAsynq(j.ID, j.Type, j.Queue))
	case j.RunAt.IsZero():
		return ErrNoRunAt
	case !inScoreRange(j.RunAt):
		return ErrRunAtRange
	case len(j.Type)+len(j.Queue)+len(j.Payload)+headersLen(j.Headers) > MaxPayloadLen:
		return ErrPayloadTooLarge
	case badHeaders(j.Headers) != "":
		return fmt.Errorf("%w: %s", ErrUnfitForAsynq, badHeaders(j.Headers))
	}
	return nil
}

// Schedule adds jobs to the schedule, each due at its RunAt (a time in the
// past is due at once). A job whose id is already scheduled is replaced:
// its due time and payload become the new ones. A job whose id is in flight
// gets a new run beside the one in flight, which it does not disturb.
//
// The whole call is validated before anything is written: one bad job
// (a *JobError: an empty or long id, a zero RunAt or one further from 1970
// than a score holds, a large payload) and nothing is scheduled. Jobs are
// written in chunks of MaxBatchSize, in order, each atomically; a call that
// fails while writing (out of memory, a lost connection) returns a
// *ScheduleError that tells how many of the jobs were written.
func (b *Broker) Schedule(ctx context.Context, jobs ...Job) error {
	if err := ctx.Err(); err != nil {
		return wrap(ctx, "schedule", err, nil)
	}
	last := make(map[string]int, len(jobs))
	for i := range jobs {
		if err := validateJob(&jobs[i]); err != nil {
			return &JobError{Index: i, ID: jobs[i].ID, Err: err}
		}
		last[jobs[i].ID] = i
	}
	// Chunks of up to MaxBatchSize jobs per shard, in order; the chunks of
	// one round (the first chunk of every shard, then the second, ...) go
	// in one pipeline.
	type chunk struct {
		args     []any // id, score, record per job
		consumed int   // jobs of the call it accounts for (replaced ones too)
	}
	chunks := make([][]*chunk, len(b.shards))
	for i, j := range jobs {
		s := shardOf(j.ID, len(b.shards))
		cs := chunks[s]
		if len(cs) == 0 || len(cs[len(cs)-1].args) == 3*MaxBatchSize {
			cs = append(cs, &chunk{})
			chunks[s] = cs
		}
		c := cs[len(cs)-1]
		c.consumed++
		if last[j.ID] != i {
			continue // a later job in this call replaces it
		}
		score := b.score(j.RunAt)
		c.args = append(c.args, j.ID, score, newRecord(score, &j))
	}
	written := 0 // jobs on the schedule: with one shard, jobs[:written]
	for round := 0; ; round++ {
		var shards []*keys
		more := false
		for s, cs := range chunks {
			switch {
			case round >= len(cs):
			case len(cs[round].args) == 0: // replaced jobs only: nothing to write
				written += cs[round].consumed
				more = true
			default:
				shards = append(shards, b.shards[s])
			}
		}
		if len(shards) == 0 {
			if more {
				continue
			}
			return nil
		}
		bucket, expire := b.history.bucket(time.Now())
		cmds := b.writeShards(ctx, scheduleScript, shards, func(k *keys) ([]string, []any) {
			keys := []string{k.schedule, k.pending}
			if b.history.keep > 0 {
				keys = append(keys, k.sent+bucket)
			}
			return keys, append([]any{b.notice(k), expire, b.ups}, chunks[k.shard][round].args...)
		})
		for i, cmd := range cmds {
			k := shards[i]
			res, err := cmd.Int64Slice()
			if err != nil {
				return &ScheduleError{Written: written, Total: len(jobs), Err: wrap(ctx, "schedule", err, k.types)}
			}
			if len(res) == 2 && res[1] == 1 {
				b.noticeDenied.Do(func() {
					b.log.LogAttrs(ctx, slog.LevelWarn,
						"zclaim: the server refused to publish the schedule's notice (an ACL without the channel); "+
							"dispatchers find new jobs within their MaxWait instead",
						slog.String("key", k.schedule), slog.String("channel", k.notice))
				})
			}
			written += chunks[k.shard][round].consumed
		}
	}
}

// Cancel removes a scheduled job. It reports whether the id was scheduled.
// A run of the id that is already in flight is not affected.
func (b *Broker) Cancel(ctx context.Context, id string) (bool, error) {
	n, err := b.move(ctx, "cancel", "", []string{id})
	return n == 1, err
}

// RunNow makes scheduled jobs due at once, by Redis' clock, keeping
// their occurrences. It returns how many of ids were scheduled; the
// others are passed over. The call is atomic (with Shards, shard by shard).
func (b *Broker) RunNow(ctx context.Context, ids ...string) (int, error) {
	return b.move(ctx, "now", "", ids)
}

// Reschedule moves scheduled jobs to at. A job not claimed yet becomes a
// new occurrence (as Schedule makes it); one waiting for a retry keeps
// its occurrence and only moves its retry. It returns how many of ids were
// scheduled; the others are passed over. The call is atomic (with Shards,
// shard by shard).
func (b *Broker) Reschedule(ctx context.Context, at time.Time, ids ...string) (int, error) {
	if at.IsZero() || !inScoreRange(at) {
		return 0, zerr("zclaim: reschedule: %w", ErrRunAtRange)
	}
	return b.move(ctx, "at", b.score(at), ids)
}

// CancelMany removes scheduled jobs, as Cancel does, atomically (with
// Shards, shard by shard). It
// returns how many of ids were scheduled.
func (b *Broker) CancelMany(ctx context.Context, ids ...string) (int, error) {
	return b.move(ctx, "cancel", "", ids)
}

func (b *Broker) move(ctx context.Context, mode, score string, ids []string) (int, error) {
	op := map[string]string{"now": "run now", "at": "reschedule", "cancel": "cancel"}[mode]
	for _, id := range ids {
		if err := checkID(ctx, op, id); err != nil {
			return 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, wrap(ctx, op, err, nil)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	total := 0
	err := b.byShard(ids, func(k *keys, ids []string) error {
		args := make([]any, 0, 4+len(ids))
		args = append(args, mode, b.ups, b.notice(k), score)
		for _, id := range ids {
			args = append(args, id)
		}
		n, err := b.repl.run(ctx, b.rdb, moveScript, []string{k.schedule, k.pending}, args...).Int()
		if err != nil {
			return wrap(ctx, op, err, k.types)
		}
		total += n
		return nil
	})
	return total, err
}
