package zclaimweb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/zclaim/zclaim"
)

// counts are a schedule's live figures, on the overview and in api/stats.
type counts struct {
	Key       string `json:"key"`
	Scheduled int64  `json:"scheduled"`
	Due       int64  `json:"due"`
	Inflight  int64  `json:"inflight"`
	Expired   int64  `json:"expired"`
	Dead      int64  `json:"dead"`
	Running   int64  `json:"running"`
	Abandoned int64  `json:"abandoned"`
	OldestDue string `json:"oldest_due"`
	Next      string `json:"next"`
	StateLost string `json:"state_lost"`
	Error     string `json:"error,omitempty"`
}

// ownRuns reports whether the console reads the runs of schedule b from its
// own Idempotency: it has one, and b's Broker does not already report that
// store's runs.
func (h *handler) ownRuns(b *zclaim.Broker) bool {
	return h.opts.Idempotency != nil && b.Runs() != h.opts.Idempotency
}

// runCounts counts the runs of active asynq tasks by state: running, and
// abandoned (taken over or waiting for it). It reads them only when some
// schedule's Broker does not count them itself.
func (h *handler) runCounts(ctx context.Context) (running, abandoned int64, err error) {
	if !slices.ContainsFunc(h.opts.Schedules, h.ownRuns) {
		return 0, 0, nil
	}
	runs, _, err := h.opts.Idempotency.Runs(ctx, "", 0)
	for _, r := range runs {
		switch r.State {
		case zclaim.RunLive:
			running++
		case zclaim.RunAbandoned, zclaim.RunTakenOver:
			abandoned++
		}
	}
	return running, abandoned, err
}

func (h *handler) counts(ctx context.Context) []counts {
	running, abandoned, rerr := h.runCounts(ctx)
	out := make([]counts, len(h.opts.Schedules))
	for i, b := range h.opts.Schedules {
		c := counts{Key: b.Key()}
		st, err := b.Stats(ctx)
		if err != nil {
			c.Error = err.Error()
			h.opts.Logger.Error("zclaimweb: stats", "key", b.Key(), "error", err.Error())
		}
		c.Scheduled, c.Due, c.Inflight, c.Expired, c.Dead = st.Scheduled, st.Due, st.Inflight, st.Expired, st.Dead
		c.Running, c.Abandoned = st.Running, st.Abandoned
		if h.ownRuns(b) && rerr == nil {
			c.Running, c.Abandoned = running, abandoned
		}
		if st.OldestDue > 0 {
			c.OldestDue = st.OldestDue.Round(time.Millisecond).String()
		}
		if !st.Next.IsZero() {
			c.Next = ago(st.Next)
		}
		if !st.StateLost.IsZero() {
			c.StateLost = ago(st.StateLost)
		}
		out[i] = c
	}
	return out
}

// bar is one bar of a due chart.
type bar struct {
	X, Y, W, H int
	Label      string
}

type chart struct {
	Title  string
	Bars   []bar
	Max    int64
	Total  int64
	Ticks  []tick
	Width  int
	Height int
}

type tick struct {
	X     int
	Label string
}

// dueChart draws the jobs due in n buckets of step from now.
func dueChart(ctx context.Context, b *zclaim.Broker, title string, step time.Duration, n int,
	label func(i int) string) (chart, error) {
	start := time.Now()
	got, err := b.DueCounts(ctx, start, step, n)
	if err != nil {
		return chart{}, err
	}
	c := chart{Title: title, Width: 600, Height: 120}
	for _, v := range got {
		c.Max = max(c.Max, v)
		c.Total += v
	}
	w := c.Width / n
	for i, v := range got {
		hgt := 0
		if c.Max > 0 {
			hgt = int(int64(c.Height-16) * v / c.Max)
			if v > 0 && hgt == 0 {
				hgt = 1
			}
		}
		c.Bars = append(c.Bars, bar{X: i * w, Y: c.Height - 16 - hgt, W: max(w-1, 1), H: hgt,
			Label: fmt.Sprintf("%s: %d due", label(i), v)})
		if i%(n/6) == 0 {
			c.Ticks = append(c.Ticks, tick{X: i * w, Label: label(i)})
		}
	}
	return c, nil
}

type scheduleView struct {
	N      int
	Counts counts
	Charts []chart
	Err    string
}

type overviewData struct {
	Schedules []scheduleView
	Queues    queuePage
	QueueErr  string
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var d overviewData
	for i, c := range h.counts(ctx) {
		v := scheduleView{N: i, Counts: c, Err: c.Error}
		b := h.opts.Schedules[i]
		hour, err := dueChart(ctx, b, "due in the next hour", time.Minute, 60, func(i int) string {
			return fmt.Sprintf("+%dm", i)
		})
		if err == nil {
			day, derr := dueChart(ctx, b, "due in the next day", time.Hour, 24, func(i int) string {
				return fmt.Sprintf("+%dh", i)
			})
			v.Charts, err = []chart{hour, day}, derr
		}
		if err != nil && v.Err == "" {
			v.Err = err.Error()
		}
		d.Schedules = append(d.Schedules, v)
	}
	if h.opts.Inspector != nil {
		q, err := h.queueRows("")
		d.Queues = q
		if err != nil {
			d.QueueErr = err.Error()
		}
	}
	h.render(w, r, http.StatusOK, "overview", "Overview", d)
}

func (h *handler) apiStats(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"schedules": h.counts(r.Context())})
}

type listData struct {
	N     int
	Key   string
	State string
	Jobs  []zclaim.JobInfo
	After string
	Next  string
	Acts  []action
}

// action is a button over the selected jobs of a listing or a job page.
type action struct{ Op, Label string }

var stateActs = map[string][]action{
	"scheduled": {{"run-now", "Run now"}, {"cancel", "Cancel"}},
	"dead":      {{"revive", "Revive"}, {"delete", "Delete"}},
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	n, b, ok := h.schedule(w, r)
	if !ok {
		return
	}
	state := r.PathValue("state")
	st := map[string]zclaim.JobState{"scheduled": zclaim.StateScheduled, "inflight": zclaim.StateInFlight,
		"dead": zclaim.StateDead}[state]
	if st == zclaim.StateUnknown {
		h.fail(w, r, http.StatusNotFound, "no such listing: "+state, nil)
		return
	}
	after := r.URL.Query().Get("after")
	l, err := b.List(r.Context(), st, zclaim.ListOptions{After: after, Limit: h.opts.PageSize})
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, "list "+state, err)
		return
	}
	h.render(w, r, http.StatusOK, "list", state, listData{N: n, Key: b.Key(), State: state, Jobs: l.Jobs,
		After: after, Next: l.Next, Acts: stateActs[state]})
}

type jobData struct {
	N        int
	Key      string
	ID       string
	Entries  []entry
	Runs     []zclaim.RunInfo
	RunsErrs []string // why runs could not be read: each queue passed over, or the one error
}

type entry struct {
	zclaim.JobInfo
	Acts       []action
	Reschedule bool
}

func (h *handler) job(w http.ResponseWriter, r *http.Request) {
	n, b, ok := h.schedule(w, r)
	if !ok {
		return
	}
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	d := jobData{N: n, Key: b.Key(), ID: id}
	if id == "" {
		h.render(w, r, http.StatusOK, "job", "Find a job", d)
		return
	}
	if why := badID(id); why != "" {
		h.fail(w, r, http.StatusBadRequest, why, nil)
		return
	}
	jobs, err := b.Jobs(r.Context(), id)
	var queueErr *zclaim.QueueError
	if err != nil && !errors.Is(err, zclaim.ErrNotFound) && !errors.As(err, &queueErr) {
		h.fail(w, r, http.StatusBadGateway, "look up the job", err)
		return
	}
	if queueErr != nil { // a broker made with Runs passed over a queue: the entries it found are shown
		d.RunsErrs = strings.Split(err.Error(), "\n")
	}
	for _, j := range jobs {
		e := entry{JobInfo: j}
		switch j.State {
		case zclaim.StateScheduled:
			e.Acts, e.Reschedule = stateActs["scheduled"], true
		case zclaim.StateDead:
			e.Acts = stateActs["dead"]
		}
		d.Entries = append(d.Entries, e)
	}
	if h.ownRuns(b) { // else the Broker's entries hold the runs
		runs, _, err := h.opts.Idempotency.Runs(r.Context(), "", 0)
		if err != nil { // a store other than the Broker's may name the same queues
			for _, e := range strings.Split(err.Error(), "\n") {
				if !slices.Contains(d.RunsErrs, e) {
					d.RunsErrs = append(d.RunsErrs, e)
				}
			}
		}
		for _, run := range runs {
			if run.OfJob(id) {
				d.Runs = append(d.Runs, run)
			}
		}
	}
	status := http.StatusOK
	if len(d.Entries) == 0 && len(d.Runs) == 0 {
		status = http.StatusNotFound
	}
	h.render(w, r, status, "job", "Job "+id, d)
}

type periodicData struct {
	N    int
	Key  string
	Defs []zclaim.PeriodicInfo
}

func (h *handler) periodic(w http.ResponseWriter, r *http.Request) {
	n, b, ok := h.schedule(w, r)
	if !ok {
		return
	}
	defs, err := b.ListPeriodic(r.Context())
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, "list the periodic definitions", err)
		return
	}
	h.render(w, r, http.StatusOK, "periodic", "Periodic", periodicData{N: n, Key: b.Key(), Defs: defs})
}

type runsData struct {
	Prefix string
	Runs   []zclaim.RunInfo
	After  string
	Next   string
	Errs   []string // the queues that could not be read, one each
}

func (h *handler) runs(w http.ResponseWriter, r *http.Request) {
	if h.opts.Idempotency == nil {
		h.fail(w, r, http.StatusNotFound, "no idempotency store: the console was made without one", nil)
		return
	}
	after := r.URL.Query().Get("after")
	runs, next, err := h.opts.Idempotency.Runs(r.Context(), after, h.opts.PageSize)
	var queueErr *zclaim.QueueError
	if err != nil && !errors.As(err, &queueErr) {
		h.fail(w, r, http.StatusBadGateway, "list the runs", err)
		return
	}
	d := runsData{Prefix: h.opts.Idempotency.Prefix(), Runs: runs, After: after, Next: next}
	if queueErr != nil {
		d.Errs = strings.Split(err.Error(), "\n") // each queue passed over; the others' runs are listed
	}
	h.render(w, r, http.StatusOK, "runs", "Runs", d)
}

type queueRow struct {
	Name                                                        string
	Size, Pending, Active, Scheduled, Retry, Archived, Complete int
	Paused                                                      bool
	Err                                                         string // why the queue cannot be read
}

// queuePage is a page of asynq's queues, by name.
type queuePage struct {
	Rows  []*queueRow
	After string // the name the page follows ("" for the first)
	Next  string // the last name of this page when more follow, else ""
}

// queueRows reads a page of asynq's queues by name (PageSize of them after
// the name after): each costs asynq's Inspector a few round trips, so a
// server with thousands of queues is read a page at a time. A queue whose
// keys cannot be read (one of another type) is listed with why, and keeps
// no other from its row.
func (h *handler) queueRows(after string) (queuePage, error) {
	names, err := h.opts.Inspector.Queues()
	if err != nil {
		return queuePage{}, err
	}
	slices.Sort(names)
	i, found := slices.BinarySearch(names, after)
	if found {
		i++
	}
	names = names[i:]
	p := queuePage{After: after}
	if len(names) > h.opts.PageSize {
		names = names[:h.opts.PageSize]
		p.Next = names[len(names)-1]
	}
	rows := make([]*queueRow, 0, len(names))
	for _, q := range names {
		qi, err := h.opts.Inspector.GetQueueInfo(q)
		if err != nil {
			rows = append(rows, &queueRow{Name: q, Err: err.Error()})
			continue
		}
		rows = append(rows, &queueRow{Name: q, Size: qi.Size, Pending: qi.Pending, Active: qi.Active,
			Scheduled: qi.Scheduled, Retry: qi.Retry, Archived: qi.Archived, Complete: qi.Completed, Paused: qi.Paused})
	}
	p.Rows = rows
	return p, nil
}

func (h *handler) queues(w http.ResponseWriter, r *http.Request) {
	if h.opts.Inspector == nil {
		h.fail(w, r, http.StatusNotFound, "no asynq Inspector: the console was made without one", nil)
		return
	}
	page, err := h.queueRows(r.URL.Query().Get("after"))
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, "read asynq's queues", err)
		return
	}
	h.render(w, r, http.StatusOK, "queues", "asynq queues", page)
}
