// Package queue is a layered application's port: the service polls
// through it and never imports an implementation (shape 7 of the
// corpus). The implementations' own reads and removals pair (pairFields):
// naive's read is reported racy, counted's checked, and the service is
// quiet.
package queue

import "context"

type Queue interface {
	Due(ctx context.Context, now string) ([]string, error)
	Remove(ctx context.Context, id string) (bool, error)
}
