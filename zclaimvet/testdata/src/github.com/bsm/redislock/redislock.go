// Package redislock stands in for bsm/redislock: Obtain.
package redislock

import (
	"context"
	"time"
)

type Client struct{}

type Options struct{}

type Lock struct{}

func (c *Client) Obtain(ctx context.Context, key string, ttl time.Duration, opt *Options) (*Lock, error) {
	return &Lock{}, nil
}

func Obtain(ctx context.Context, client interface{}, key string, ttl time.Duration, opt *Options) (*Lock, error) {
	return &Lock{}, nil
}

func (l *Lock) Release(ctx context.Context) error { return nil }
