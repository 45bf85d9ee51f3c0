package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/zclaim/zclaim"
)

var watchInterval *time.Duration
var watchCount *int

func watchFlags(fs *flag.FlagSet) {
	watchInterval = fs.Duration("interval", time.Second, "time between refreshes")
	watchCount = fs.Int("count", 0, "stop after this many refreshes (0: until interrupted)")
}

// cmdWatch prints the counts every interval, in place on a terminal (like
// top), with the change since the last refresh; --json prints one object
// per line instead.
func cmdWatch(ctx context.Context, c *cli, args []string) int {
	if len(args) > 0 || *watchInterval <= 0 || *watchCount < 0 {
		fmt.Fprintln(c.errw, "usage: zclaim watch [--interval D] [--count N]")
		return exitUsage
	}
	tty := isTerminal(c.out)
	var last zclaim.Stats
	var lastAt time.Time
	for i := 0; *watchCount == 0 || i < *watchCount; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return exitOK
			case <-time.After(*watchInterval):
			}
		}
		st, err := c.b.Stats(ctx)
		if ctx.Err() != nil {
			return exitOK
		}
		if err != nil {
			return c.fail(err)
		}
		now := time.Now()
		if c.json {
			c.printLine(map[string]any{"time": now.UTC(), "scheduled": st.Scheduled,
				"due": st.Due, "inflight": st.Inflight,
				"expired": st.Expired, "dead": st.Dead, "oldest_due_seconds": st.OldestDue.Seconds()})
			continue
		}
		rate := func(cur, prev int64) string {
			if lastAt.IsZero() {
				return ""
			}
			return fmt.Sprintf("%+.1f/s", float64(cur-prev)/now.Sub(lastAt).Seconds())
		}
		if tty {
			fmt.Fprint(c.out, "\033[H\033[2J")
		} else if i > 0 {
			fmt.Fprintln(c.out)
		}
		fmt.Fprintf(c.out, "zclaim watch %s  every %v  %s\n", c.key, *watchInterval, now.UTC().Format("15:04:05"))
		table(c.out, [][]string{
			{"", "JOBS", "CHANGE"},
			{"scheduled", strconv.FormatInt(st.Scheduled, 10), rate(st.Scheduled, last.Scheduled)},
			{"due", strconv.FormatInt(st.Due, 10), rate(st.Due, last.Due)},
			{"in flight", strconv.FormatInt(st.Inflight, 10), rate(st.Inflight, last.Inflight)},
			{"expired", strconv.FormatInt(st.Expired, 10), rate(st.Expired, last.Expired)},
			{"dead", strconv.FormatInt(st.Dead, 10), rate(st.Dead, last.Dead)},
			{"oldest due", st.OldestDue.Round(time.Millisecond).String(), ""},
		})
		last, lastAt = st, now
	}
	return exitOK
}
