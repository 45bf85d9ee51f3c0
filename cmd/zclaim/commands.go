package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zclaim/zclaim"
)

func cmdStats(ctx context.Context, c *cli, args []string) int {
	if len(args) > 0 {
		fmt.Fprintf(c.errw, "zclaim stats: unexpected arguments %q\n", args)
		return exitUsage
	}
	st, err := c.b.Stats(ctx)
	if err != nil {
		return c.fail(err)
	}
	// The runs need asynq's keys and the run records; an operator whose
	// ACL covers only the schedule sees the rest.
	runs, _, runsErr := c.runsOf(ctx, "", 0)
	count := map[zclaim.RunState]int{}
	for _, r := range runs {
		count[r.State]++
	}
	if c.json {
		c.printJSON(struct {
			Key string
			zclaim.Stats
			OldestDueSeconds float64
			Running          int
			Abandoned        int
		}{c.key, st, st.OldestDue.Seconds(), count[zclaim.RunLive],
			count[zclaim.RunAbandoned] + count[zclaim.RunTakenOver]})
		return exitOK
	}
	rows := [][]string{
		{"key", c.key},
		{"scheduled", strconv.FormatInt(st.Scheduled, 10)},
		{"due", strconv.FormatInt(st.Due, 10)},
		{"in flight", strconv.FormatInt(st.Inflight, 10)},
		{"expired", strconv.FormatInt(st.Expired, 10)},
		{"dead", strconv.FormatInt(st.Dead, 10)},
		{"next due", when(st.Next, time.Now())},
		{"oldest due", st.OldestDue.Round(time.Millisecond).String()},
		{"running", strconv.Itoa(count[zclaim.RunLive])},
		{"abandoned",
			strconv.Itoa(count[zclaim.RunAbandoned]+count[zclaim.RunTakenOver]) + " (runs whose worker is gone)"},
	}
	if runsErr != nil {
		rows = append(rows[:len(rows)-2], []string{"runs", "unknown: " + runsErr.Error()})
	}
	table(c.out, rows)
	return exitOK
}

var listLimit *int
var listAll *bool
var listAfter *string

func listFlags(fs *flag.FlagSet) {
	listLimit = fs.Int("limit", 50, "jobs per page, 1 to 1000")
	listAfter = fs.String("after", "", "the cursor a previous page printed")
	listAll = fs.Bool("all", false, "ls running: also the runs that need nothing (finished, not begun)")
}

func cmdList(ctx context.Context, c *cli, args []string) int {
	states := map[string]zclaim.JobState{"scheduled": zclaim.StateScheduled,
		"inflight": zclaim.StateInFlight, "dead": zclaim.StateDead}
	if len(args) == 1 && args[0] == "periodic" {
		return listPeriodic(ctx, c)
	}
	if len(args) == 1 && args[0] == "running" {
		return listRunning(ctx, c)
	}
	if len(args) != 1 || states[args[0]] == zclaim.StateUnknown {
		fmt.Fprintln(c.errw,
			"usage: zclaim ls scheduled|inflight|dead|running|periodic [--limit N] [--after CURSOR] [--json]")
		return exitUsage
	}
	l, err := c.b.List(ctx, states[args[0]], zclaim.ListOptions{After: *listAfter, Limit: *listLimit})
	if err != nil {
		return c.fail(err)
	}
	code := undecoded(c, l.Jobs, true)
	if c.json {
		c.printJSON(struct {
			Jobs []jobJSON
			Next string
		}{jobsJSON(l.Jobs), l.Next})
		return code
	}
	now := time.Now()
	var rows [][]string
	switch args[0] {
	case "scheduled":
		rows = append(rows, []string{"ID", "RUN AT", "DUE", "ATTEMPT", "TYPE", "QUEUE", "BYTES"})
	case "inflight":
		rows = append(rows, []string{"ID", "LEASE UNTIL", "DUE", "ATTEMPT", "TOKEN", "TYPE", "QUEUE"})
	case "dead":
		rows = append(rows, []string{"ID", "DIED", "DUE", "ATTEMPTS", "TYPE", "REASON"})
	}
	for _, j := range l.Jobs {
		due := j.Due.UTC().Format("2006-01-02T15:04:05.000Z")
		switch args[0] {
		case "scheduled":
			rows = append(rows,
				[]string{j.ID, when(j.RunAt, now), due, strconv.Itoa(j.Attempt), orDash(j.Type), orDash(j.Queue),
					strconv.Itoa(j.PayloadSize)})
		case "inflight":
			rows = append(rows,
				[]string{j.ID, when(j.LeaseUntil, now), due, strconv.Itoa(j.Attempt), strconv.FormatInt(j.Token, 10),
					orDash(j.Type), orDash(j.Queue)})
		case "dead":
			rows = append(rows,
				[]string{j.ID, when(j.DiedAt, now), due, strconv.Itoa(j.Attempt), orDash(j.Type), j.Reason})
		}
	}
	table(c.out, rows)
	if l.Next != "" {
		fmt.Fprintf(c.errw, "more: zclaim ls %s --key %q --after %q\n", args[0], c.key, l.Next)
	}
	return code
}

// jobJSON is a job as --json prints it: JobInfo's fields, and the error
// of a record that does not decode, which JobInfo leaves out of JSON.
type jobJSON struct {
	zclaim.JobInfo
	Error string `json:",omitempty"`
}

func jobsJSON(js []zclaim.JobInfo) []jobJSON {
	out := make([]jobJSON, 0, len(js))
	for _, j := range js {
		e := jobJSON{JobInfo: j}
		if j.Err != nil {
			e.Error = j.Err.Error()
		}
		out = append(out, e)
	}
	return out
}

// undecoded returns exitPartial when a job's record does not decode (the
// job is listed all the same, without what the record holds), else
// exitOK; toStderr writes each such job's error to stderr.
func undecoded(c *cli, jobs []zclaim.JobInfo, toStderr bool) int {
	code := exitOK
	for _, j := range jobs {
		if j.Err != nil {
			code = exitPartial
			if toStderr {
				fmt.Fprintf(c.errw, "%v\n", j.Err)
			}
		}
	}
	return code
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// cmdShow prints where a job is and the runs of the active asynq tasks
// that run it. A job's record that does not decode is shown as its
// table's error (under --json, its Error), and the exit code is
// exitPartial: the job is not all there. The runs are shown as far as
// they can be read; what cannot be (a queue's, or every queue's: an
// operator whose ACL stops at the schedule's keys, docs/operations.md)
// is written to stderr, and the exit code stays exitOK when the job was
// found.
func cmdShow(ctx context.Context, c *cli, args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(c.errw, "usage: zclaim show ID")
		return exitUsage
	}
	// The Broker with the store of --runs: the histories of its runs.
	b, idem := c.b, (*zclaim.Idempotency)(nil)
	if s, err := c.store(); err == nil {
		opts := c.bopts
		opts.Runs = s
		if rb, err := zclaim.NewBroker(c.rdb, opts); err == nil {
			b, idem = rb, s
		}
	}
	all, err := b.Jobs(ctx, args[0])
	var queueErr *zclaim.QueueError
	if err != nil && !errors.As(err, &queueErr) && idem != nil {
		// The store cannot be read (an ACL that stops at the schedule's
		// keys): the job without its runs' histories, the error below.
		b, idem = c.b, nil
		all, err = b.Jobs(ctx, args[0])
	}
	if err != nil && !errors.As(err, &queueErr) {
		return c.fail(err)
	}
	if idem != nil { // the active tasks' runs are shown from Runs, below
		all = slices.DeleteFunc(all, func(j zclaim.JobInfo) bool {
			return j.State == zclaim.StateRunning || j.State == zclaim.StateAbandoned
		})
	}
	var runs []zclaim.RunInfo
	if idem != nil {
		runs, _, err = idem.Runs(ctx, "", 0)
	} else {
		runs, _, err = c.runsOf(ctx, "", 0)
	}
	switch {
	case errors.As(err, &queueErr): // the other queues' runs were read
		fmt.Fprintf(c.errw, "%v\n", err)
	case err != nil:
		fmt.Fprintf(c.errw, "zclaim: the runs of active asynq tasks could not be read: %v\n", err)
	}
	var mine []zclaim.RunInfo
	for _, r := range runs {
		if r.Job.ID == args[0] || r.Key == args[0] || r.TaskID == args[0] {
			mine = append(mine, r)
		}
	}
	code := undecoded(c, all, false) // the table's error row, JSON's Error
	if c.json {
		if mine == nil {
			mine = []zclaim.RunInfo{}
		}
		c.printJSON(struct {
			Jobs []jobJSON
			Runs []zclaim.RunInfo
		}{jobsJSON(all), mine})
	}
	if len(all) == 0 && len(mine) == 0 {
		fmt.Fprintf(c.errw,
			"zclaim: job %q is not scheduled, in flight or dead (key %s), no dispatcher enqueued it within the "+
				"schedule's history, and no active asynq task runs it (runs %s)\n",
			args[0], c.key, c.runs)
		return exitPartial
	}
	if c.json {
		return code
	}
	defer func() {
		for _, r := range mine {
			fmt.Fprintln(c.out)
			table(c.out, runRows(r, time.Now()))
		}
	}()
	now := time.Now()
	for i, j := range all {
		if i > 0 {
			fmt.Fprintln(c.out)
		}
		rows := [][]string{{"id", j.ID}, {"state", j.State.String()}, {"occurrence", j.Occurrence()},
			{"due", when(j.Due, now)}}
		switch j.State {
		case zclaim.StateScheduled:
			rows = append(rows, []string{"run at", when(j.RunAt, now)},
				[]string{"next attempt", strconv.Itoa(j.Attempt)})
		case zclaim.StateInFlight:
			rows = append(rows, []string{"attempt", strconv.Itoa(j.Attempt)},
				[]string{"lease until", when(j.LeaseUntil, now)},
				[]string{"token", strconv.FormatInt(j.Token, 10)})
		case zclaim.StateDead:
			rows = append(rows, []string{"attempts", strconv.Itoa(j.Attempt)}, []string{"died", when(j.DiedAt, now)},
				[]string{"reason", j.Reason})
		case zclaim.StateEnqueued:
			rows = append(rows, enqueuedRows(j, now)...)
			table(c.out, rows)
			continue
		}
		rows = append(rows, []string{"type", orDash(j.Type)}, []string{"queue", orDash(j.Queue)},
			[]string{"payload", strconv.Itoa(j.PayloadSize) + " bytes"})
		if j.Err != nil {
			rows = append(rows, []string{"error", j.Err.Error()})
		}
		table(c.out, rows)
	}
	return code
}

var all *bool

func allFlag(fs *flag.FlagSet) { all = fs.Bool("all", false, "every job of the dead set") }

// byIDs runs a command that acts on ids: cancel, run-now, revive,
// delete-dead. It prints how many of the ids it acted on, and exits 1 when
// some were not in the state it acts on.
func byIDs(name, did, not string) func(ctx context.Context, c *cli, args []string) int {
	return func(ctx context.Context, c *cli, args []string) int {
		every := all != nil && *all
		if every == (len(args) > 0) {
			if all != nil {
				fmt.Fprintf(c.errw, "usage: zclaim %s ID... | --all\n", name)
			} else {
				fmt.Fprintf(c.errw, "usage: zclaim %s ID...\n", name)
			}
			return exitUsage
		}
		act := map[string]func(context.Context, ...string) (int, error){
			"cancel": c.b.CancelMany, "run-now": c.b.RunNow, "revive": c.b.Revive, "delete-dead": c.b.DeleteDead,
		}[name]
		if every {
			// A page of the dead set at a time, until it is empty (or a
			// page finds nothing left to take: jobs that died since).
			n := 0
			for {
				l, err := c.b.List(ctx, zclaim.StateDead, zclaim.ListOptions{Limit: zclaim.MaxListLimit})
				if err != nil {
					return c.fail(err)
				}
				ids := make([]string, len(l.Jobs))
				for i, j := range l.Jobs {
					ids[i] = j.ID
				}
				k, err := act(ctx, ids...)
				n += k
				if err != nil {
					return c.fail(err)
				}
				if l.Next == "" || k == 0 {
					break
				}
			}
			c.report(name, did, n, n, []string{})
			return exitOK
		}
		// Which ids are not where the command acts: looked up first, to
		// name them (the command itself is atomic).
		want := zclaim.StateScheduled
		if name == "revive" || name == "delete-dead" {
			want = zclaim.StateDead
		}
		missing := []string{}
		for _, id := range args {
			js, err := c.b.Jobs(ctx, id)
			if err != nil {
				return c.fail(err)
			}
			if !slices.ContainsFunc(js, func(j zclaim.JobInfo) bool { return j.State == want }) {
				missing = append(missing, id)
			}
		}
		n, err := act(ctx, args...)
		if err != nil {
			return c.fail(err)
		}
		c.report(name, did, n, len(args), missing)
		if n < len(args) {
			fmt.Fprintf(c.errw, "zclaim %s: %d of %d ids %s: %s\n", name, len(args)-n, len(args), not,
				strings.Join(missing, " "))
			return exitPartial
		}
		return exitOK
	}
}

func (c *cli) report(name, did string, n, of int, missing []string) {
	if c.json {
		c.printJSON(map[string]any{"command": name, "done": n, "of": of, "missing": missing})
		return
	}
	fmt.Fprintf(c.out, "%s %d of %d\n", did, n, of)
}

// listPeriodic prints the periodic definitions and their next ticks. One
// that cannot be read here is listed with "?" for its zone, its error goes
// to stderr, and the exit code is exitPartial.
func listPeriodic(ctx context.Context, c *cli) int {
	ps, err := c.b.ListPeriodic(ctx)
	if err != nil {
		return c.fail(err)
	}
	slices.SortFunc(ps, func(a, b zclaim.PeriodicInfo) int { return strings.Compare(a.Name, b.Name) })
	code := exitOK
	for _, p := range ps {
		if p.Err != nil {
			code = exitPartial
		}
	}
	zone := func(p zclaim.PeriodicInfo) string {
		if p.Err != nil {
			return "?"
		}
		return p.Location.String()
	}
	if c.json {
		type def struct {
			Name, Spec, Location, Type, Queue, Missed string
			PayloadSize                               int
			Next                                      time.Time
			Error                                     string `json:",omitempty"`
		}
		out := []def{}
		for _, p := range ps {
			d := def{p.Name, p.Spec, zone(p), p.Type, p.Queue,
				map[zclaim.MissedTicks]string{zclaim.RunLatest: "run latest", zclaim.SkipMissed: "skip"}[p.Missed],
				len(p.Payload), p.Next, ""}
			if p.Err != nil {
				d.Error = p.Err.Error()
			}
			out = append(out, d)
		}
		c.printJSON(out)
		return code
	}
	rows := [][]string{{"NAME", "SPEC", "ZONE", "TYPE", "QUEUE", "NEXT TICK"}}
	now := time.Now()
	for _, p := range ps {
		rows = append(rows, []string{p.Name, orDash(p.Spec), zone(p), orDash(p.Type), orDash(p.Queue), when(p.Next, now)})
	}
	table(c.out, rows)
	for _, p := range ps {
		if p.Err != nil {
			fmt.Fprintf(c.errw, "%v\n", p.Err)
		}
	}
	return code
}

// runsOf reads the idempotency store's runs of active asynq tasks.
func (c *cli) runsOf(ctx context.Context, after string, limit int) ([]zclaim.RunInfo, string, error) {
	idem, err := c.store()
	if err != nil {
		return nil, "", err
	}
	return idem.Runs(ctx, after, limit)
}

// runRows describes one run for show.
// enqueuedRows tell what became of a job a Dispatcher enqueued: its asynq
// task, and where asynq has it.
func enqueuedRows(j zclaim.JobInfo, now time.Time) [][]string {
	state := j.TaskState
	if state == "" {
		state = "gone from asynq (a completed task is kept for its retention only)"
	}
	rows := [][]string{{"enqueued", when(j.Enqueued, now)}, {"queue", orDash(j.Queue)}, {"asynq task", j.TaskID},
		{"asynq state", state}}
	if j.Retried > 0 {
		rows = append(rows, []string{"retried", strconv.Itoa(j.Retried)})
	}
	if j.LastError != "" {
		rows = append(rows, []string{"last error", j.LastError})
	}
	if j.RunDone {
		rows = append(rows, []string{"run", "finished"})
	}
	rows = append(rows, tookRows(j.TakenOver, now)...)
	for n, e := range j.History {
		key := ""
		if n == 0 {
			key = "history"
		}
		at := "-"
		if !e.At.IsZero() {
			at = e.At.UTC().Format("2006-01-02 15:04:05.000Z")
		}
		line := at + "  " + e.What
		if e.Detail != "" {
			line += ": " + e.Detail
		}
		rows = append(rows, []string{key, line})
	}
	return rows
}

// tookRows say who took a run over from its dead worker, if anyone did.
func tookRows(t *zclaim.Takeover, now time.Time) [][]string {
	if t == nil {
		return nil
	}
	return [][]string{{"taken over", when(t.At, now) + " " + t.String()}}
}

func runRows(r zclaim.RunInfo, now time.Time) [][]string {
	rows := [][]string{{"run of", r.Key}, {"state", string(r.State)},
		{"asynq task", r.Queue + "/" + r.TaskID + " (" + r.Type + ")"}}
	if r.Token != 0 {
		rows = append(rows, []string{"token", strconv.FormatInt(r.Token, 10)},
			[]string{"started", when(r.Started, now)})
	}
	if !r.LeaseUntil.IsZero() {
		rows = append(rows, []string{"lease until", when(r.LeaseUntil, now)})
	}
	return append(rows, tookRows(r.TakenOver, now)...)
}

// listRunning lists the runs of active asynq tasks. The queues that cannot
// be read are written to stderr after the others' runs, a line each, and
// the exit code is exitPartial.
func listRunning(ctx context.Context, c *cli) int {
	runs, next, err := c.runsOf(ctx, *listAfter, *listLimit)
	var queueErr *zclaim.QueueError
	if err != nil && !errors.As(err, &queueErr) {
		return c.fail(err)
	}
	code := exitOK
	if queueErr != nil {
		defer fmt.Fprintf(c.errw, "%v\n", err) // errors.Join: a line a queue
		code = exitPartial
	}
	if !*listAll { // what an operator looks for: live runs, and those a takeover will start again
		runs = slices.DeleteFunc(runs, func(r zclaim.RunInfo) bool {
			return r.State == zclaim.RunFinished || r.State == zclaim.RunNone
		})
	}
	if c.json {
		if runs == nil {
			runs = []zclaim.RunInfo{}
		}
		c.printJSON(struct {
			Runs []zclaim.RunInfo
			Next string
		}{runs, next})
		return code
	}
	now := time.Now()
	rows := [][]string{{"KEY", "STATE", "TOKEN", "STARTED", "LEASE UNTIL", "QUEUE", "TASK"}}
	for _, r := range runs {
		tok := "-"
		if r.Token != 0 {
			tok = strconv.FormatInt(r.Token, 10)
		}
		rows = append(rows,
			[]string{r.Key, string(r.State), tok, when(r.Started, now), when(r.LeaseUntil, now), r.Queue, r.TaskID})
	}
	table(c.out, rows)
	if next != "" {
		fmt.Fprintf(c.errw, "more: zclaim ls running --runs %q --after %q\n", c.runs, next)
	}
	return code
}
