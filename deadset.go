package zclaim

// The dead set: listing it, and taking jobs out of it.

import (
	"context"
	"slices"
	"strconv"
	"time"
)

// DeadJob is an entry of the dead set.
type DeadJob struct {
	Job
	Due      time.Time // the due time of its occurrence (see JobInfo)
	Attempts int       // claims the job had
	Reason   string    // why it died: "lease expired", "attempts exhausted", or Kill's reason
	DiedAt   time.Time // by Redis' clock
	Err      error     // set when the stored record could not be decoded
}

// Dead lists up to max jobs of the dead set, oldest death first.
func (b *Broker) Dead(ctx context.Context, max int) ([]DeadJob, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrap(ctx, "dead", err, nil)
	}
	if max <= 0 {
		return nil, zerr("zclaim: dead: %w: max must be positive, not %d", ErrInvalidArgument, max)
	}
	// The oldest max of each shard, merged (one shard: its oldest max).
	cmds := b.eachShard(ctx, deadScript, func(k *keys) ([]string, []any) {
		return []string{k.schedule, k.pending, k.dead, k.deadInfo}, []any{"list", b.ups, b.notice(k), max}
	})
	var out []DeadJob
	for i, cmd := range cmds {
		raw, err := cmd.Slice()
		if err != nil {
			return nil, wrap(ctx, "dead", err, b.shards[i].types)
		}
		for i := 0; i+2 < len(raw); i += 3 {
			id, _ := raw[i].(string)
			at, _ := raw[i+1].(string)
			ms, _ := strconv.ParseFloat(at, 64)
			d := DeadJob{Job: Job{ID: id}, DiedAt: time.UnixMilli(int64(ms))}
			if info, ok := raw[i+2].(string); ok {
				var due string
				d.Reason, d.Attempts, due, d.Err = decodeDeadInfo(info, &d.Job)
				d.Due = b.dueTime(due)
			}
			out = append(out, d)
		}
	}
	if len(b.shards) > 1 {
		slices.SortStableFunc(out, func(x, y DeadJob) int { return x.DiedAt.Compare(y.DiedAt) })
		out = out[:min(len(out), max)]
	}
	return out, nil
}

// Revive puts dead jobs back on the schedule, due at once by Redis' clock,
// with the type, queue and payload they died with and a fresh count of
// attempts. An id that was scheduled again meanwhile keeps that entry (the
// newer work) and only leaves the dead set; ids that are not dead are
// passed over. It returns how many of ids were dead. The call is atomic
// (with Shards, shard by shard).
func (b *Broker) Revive(ctx context.Context, ids ...string) (int, error) {
	return b.takeDead(ctx, "revive", ids)
}

// DeleteDead removes jobs from the dead set for good. It returns how many
// of ids were dead. The call is atomic (with Shards, shard by shard).
func (b *Broker) DeleteDead(ctx context.Context, ids ...string) (int, error) {
	return b.takeDead(ctx, "delete", ids)
}

func (b *Broker) takeDead(ctx context.Context, op string, ids []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, wrap(ctx, op, err, nil)
	}
	for _, id := range ids {
		if err := checkID(ctx, op, id); err != nil {
			return 0, err
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	total := 0
	err := b.byShard(ids, func(k *keys, ids []string) error {
		args := make([]any, 0, 3+len(ids))
		args = append(args, op, b.ups, b.notice(k))
		for _, id := range ids {
			args = append(args, id)
		}
		n, err := b.repl.run(ctx, b.rdb, deadScript, []string{k.schedule, k.pending, k.dead, k.deadInfo}, args...).Int()
		if err != nil {
			return wrap(ctx, op, err, k.types)
		}
		total += n
		return nil
	})
	return total, err
}
