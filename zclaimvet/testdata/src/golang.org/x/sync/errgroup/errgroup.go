// Package errgroup is the part of x/sync's errgroup the tests use.
package errgroup

import "context"

type Group struct{}

func WithContext(ctx context.Context) (*Group, context.Context) { return &Group{}, ctx }

func (*Group) Go(f func() error)         {}
func (*Group) Wait() error               { return nil }
func (*Group) TryGo(f func() error) bool { return true }
