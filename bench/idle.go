package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// scriptCalls counts the scripts the server ran (EVAL, EVALSHA and their
// read-only forms), from INFO commandstats.
func scriptCalls(rdb *redis.Client) int64 { return callsOf(rdb, "cmdstat_eval") }

// idleScenario: dispatchers on one schedule with nothing due, with and
// without keyspace events, and what they cost the server per second.
func idleScenario() {
	admin := newClient(4)
	defer admin.Close()
	ctx := context.Background()
	old, _ := admin.ConfigGet(ctx, "notify-keyspace-events").Result()
	defer admin.ConfigSet(ctx, "notify-keyspace-events", old["notify-keyspace-events"])
	measure := 10 * time.Second
	if *quick {
		measure = 3 * time.Second
	}
	var rows [][]string
	for _, c := range []struct {
		n      int
		events string
	}{{1, ""}, {50, ""}, {1, "Kz"}, {50, "Kz"}} {
		admin.ConfigSet(ctx, "notify-keyspace-events", c.events)
		key := ns("idle")
		rdb := newClient(c.n * 4)
		ac := asynq.NewClientFromRedisClient(rdb)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{}, c.n)
		for range c.n {
			b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key})
			if err != nil {
				panic(err)
			}
			d, err := zclaim.NewDispatcher(b, ac, zclaim.DispatcherOptions{DefaultType: "t"})
			if err != nil {
				panic(err)
			}
			go func() { d.Run(cctx); done <- struct{}{} }()
		}
		time.Sleep(2 * time.Second) // past start-up
		s0, c0 := scriptCalls(admin), commandCalls(admin)
		time.Sleep(measure)
		s1, c1 := scriptCalls(admin), commandCalls(admin)
		cancel()
		for range c.n {
			<-done
		}
		ac.Close()
		rdb.Close()
		dropKeys(admin, key)
		events := "off"
		if c.events != "" {
			events = "`" + c.events + "`"
		}
		rows = append(rows, []string{strconv.Itoa(c.n), events,
			fmt.Sprintf("%.1f", float64(s1-s0)/measure.Seconds()), fmt.Sprintf("%.0f", float64(c1-c0)/measure.Seconds())})
		progress("idle: %d dispatchers, events %s: %s scripts/s", c.n, events, rows[len(rows)-1][2])
	}
	table("Idle dispatchers: nothing due, what they cost the server",
		[]string{"dispatchers on one schedule", "keyspace events", "scripts/s (all)", "commands/s (all, incl. scripts' own)"}, rows,
		fmt.Sprintf("Default options, %v measured after 2 s of start-up, counted with INFO commandstats (every script and command the server ran). "+
			"With keyspace events for sorted sets an idle dispatcher looks at the schedule about once a second (a ZADD by any program wakes it); "+
			"without, once per MaxWait (50 ms). A recovery pass rests while its dispatcher's claims find nothing due and nothing in flight. "+
			"Target: 50 dispatchers with keyspace events ≤ 60 scripts/s in all.", measure))
}
