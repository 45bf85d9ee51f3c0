package zclaim

// What wakes the dispatcher early: Schedule's notices, and keyspace
// events where the server publishes them.

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// listen forwards schedule notices (an earlier job was scheduled) to wake,
// and each confirmation of the subscription too: go-redis subscribes again
// after a lost connection, and notices sent meanwhile are lost, so the
// schedule must be looked at again. Where the server publishes keyspace
// events for the schedule key, a ZADD by any program wakes it as well, at
// most once per keyspaceQuiet so that a busy producer does not turn every
// ZADD into a claim.
func (d *Dispatcher) listen(ctx context.Context, wake chan<- struct{}) {
	var channels []string
	for _, k := range d.b.shards {
		channels = append(channels, k.notice)
	}
	ks, hasKS := keyspaceChannel(d.b.rdb, d.b.keys.schedule)
	if hasKS && len(d.b.shards) == 1 {
		channels = append(channels, ks)
	}
	// On Redis Cluster the scripts publish with SPUBLISH (see Broker.notice):
	// each notice goes to the node of its shard only, and a subscription
	// (SSUBSCRIBE) takes the channels of one slot: one per shard.
	if cc, ok := d.b.rdb.(*redis.ClusterClient); ok {
		var wg sync.WaitGroup
		for _, ch := range channels {
			wg.Add(1)
			go func() { defer wg.Done(); d.listenOn(ctx, cc.SSubscribe, []string{ch}, "", wake) }()
		}
		wg.Wait()
		return
	}
	if !hasKS || len(d.b.shards) > 1 {
		ks = ""
	}
	d.listenOn(ctx, d.b.rdb.Subscribe, channels, ks, wake)
}

// keyspaceOn reports whether the server publishes keyspace events for
// sorted sets (notify-keyspace-events with K, and z or A). A server that
// will not say (CONFIG refused) counts as not publishing them.
func (d *Dispatcher) keyspaceOn(ctx context.Context) bool {
	cfg, err := d.b.rdb.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return false
	}
	f := cfg["notify-keyspace-events"]
	return strings.ContainsRune(f, 'K') && strings.ContainsAny(f, "zA")
}

// listenOn is listen on one subscription to channels, ks the keyspace
// channel among them ("" for none).
func (d *Dispatcher) listenOn(ctx context.Context, subscribe func(context.Context, ...string) *redis.PubSub,
	channels []string, ks string, wake chan<- struct{}) {
	hasKS := ks != ""
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	quiet := time.NewTimer(0)
	defer quiet.Stop()
	var lastKS time.Time
	held := false // a keyspace wake waits for the quiet period to end
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		ps := subscribe(ctx, channels...)
		ch := ps.ChannelWithSubscriptions()
		// Keyspace events let an idle claim stage sleep longer; asked
		// again at each subscription (the setting can change).
		d.keyspace.Store(hasKS && d.keyspaceOn(ctx))
	recv:
		for {
			select {
			case <-ctx.Done():
				break recv
			case <-quiet.C:
				if held {
					held, lastKS = false, time.Now()
					poke()
				}
			case m, ok := <-ch:
				if !ok {
					break recv
				}
				backoff = 10 * time.Millisecond
				if msg, isMsg := m.(*redis.Message); isMsg && hasKS && msg.Channel == ks {
					if msg.Payload != "zadd" && msg.Payload != "zincr" {
						continue // the claim's own removals, and the like
					}
					if since := time.Since(lastKS); since < keyspaceQuiet {
						if !held {
							held = true
							resetTimer(quiet, keyspaceQuiet-since)
						}
						continue
					}
					lastKS = time.Now()
				}
				poke()
			}
		}
		ps.Close()
		d.keyspace.Store(false) // events are lost while the subscription is down
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
			backoff = min(2*backoff, d.opts.MaxWait)
		}
	}
}

// keyspaceQuiet is the least time between two wakes by keyspace events.
const keyspaceQuiet = time.Millisecond

// keyspaceChannel names the keyspace-event channel of key on rdb's server,
// for a client of one server (a cluster publishes keyspace events on the
// node that holds the key, which a cluster client does not subscribe to).
func keyspaceChannel(rdb redis.UniversalClient, key string) (string, bool) {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return "", false
	}
	return "__keyspace@" + strconv.Itoa(c.Options().DB) + "__:" + key, true
}
