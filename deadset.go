package zclaim

// The dead set: taking jobs out of it (List(StateDead) lists it).

import (
	"context"
)

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
