package service

import (
	"context"
	"time"

	"layered/queue"
)

type Scheduler struct{ q queue.Queue }

func (s *Scheduler) Tick(ctx context.Context) {
	ids, err := s.q.Due(ctx, time.Now().Format("20060102150405"))
	if err != nil {
		return
	}
	for _, id := range ids {
		if ok, err := s.q.Remove(ctx, id); err != nil || !ok {
			continue
		}
		run(id)
	}
}

func run(string) {}
