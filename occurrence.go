package zclaim

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// JobInfo names one run of a job: which job, which occurrence of it, and
// which attempt. Handlers read it with JobFromContext.
//
// An occurrence is a job id together with the due time it was first
// scheduled for. A member scheduled again after it ran, at any due time,
// is a new occurrence and runs again; every duplicate of one occurrence (a
// re-dispatch after a dispatcher died, a second asynq task for it, the same
// ZADD repeated with the same score) runs at most once. A retry's backoff
// moves the job on the schedule but keeps its occurrence; rescheduling a
// job that has not run yet moves it to a new occurrence.
//
// Broker.Job and Broker.List fill in the rest: where the job is and what
// it carries. Fields that do not apply to its State are zero.
type JobInfo struct {
	ID  string    // the job id: the member of the schedule set
	Due time.Time // the occurrence's due time, to the millisecond
	// Attempt is 1 on the first claim of the occurrence, 2 after one
	// retry, ...; for a scheduled job, the attempt its next claim makes.
	Attempt int

	State       JobState  `json:",omitzero"` // scheduled, in flight or dead; unknown from JobFromContext
	RunAt       time.Time `json:",omitzero"` // scheduled: when it is next due (after a retry's backoff, later than Due)
	Type        string    `json:",omitzero"` // asynq task type; "" for a member written by another program
	Queue       string    `json:",omitzero"` // asynq queue; "" means "default"
	PayloadSize int       `json:",omitzero"` // bytes of payload
	LeaseUntil  time.Time `json:",omitzero"` // in flight, running or abandoned: the lease deadline by Redis' clock
	Token       int64     `json:",omitzero"` // in flight, running or abandoned: the claim's or the run's fencing token
	DiedAt      time.Time `json:",omitzero"` // dead: when, by Redis' clock
	Reason      string    `json:",omitzero"` // dead: why ("lease expired", "attempts exhausted", Kill's reason)
	TaskID      string    `json:",omitzero"` // running, abandoned or enqueued: the asynq task whose run it is
	Started     time.Time `json:",omitzero"` // running or abandoned: when the run began, by Redis' clock
	Err         error     `json:"-"`         // set when the stored record could not be decoded
	// Enqueued: when a Dispatcher enqueued the task, by Redis' clock.
	Enqueued time.Time `json:",omitzero"`
	// TaskState is enqueued's asynq state of the task: "pending",
	// "active", "scheduled", "retry", "archived", "completed" (kept for
	// its retention), or "" when asynq no longer has it.
	TaskState string `json:",omitzero"`
	Retried   int    `json:",omitzero"` // enqueued: the times asynq retried the task
	LastError string `json:",omitzero"` // enqueued: the error of the task's last failure
	// RunDone is enqueued's: the Broker's Runs store records the task's
	// run as finished (within its Retention).
	RunDone bool `json:",omitzero"`
	// TakenOver: a live process took the task's run over from a dead
	// worker (Runs' record of it; running, abandoned or enqueued).
	TakenOver *Takeover `json:",omitempty"`
	// History is the occurrence's story, oldest first, from the events
	// the scripts of each step wrote (BrokerOptions.History, and with
	// Runs the store's), completed by asynq's record of the task:
	// scheduled, claimed, enqueued, back on the schedule, dead, started,
	// failed, lease lost, skipped, taken over, finished, archived.
	History []Event `json:",omitempty"`
}

// Event is one step of an occurrence's History.
type Event struct {
	At   time.Time // by Redis' clock (asynq's own: to the second)
	What string    // "scheduled", "claimed", "enqueued", "back on the schedule", "dead", "started", "failed", "lease lost", "skipped", "taken over", "finished", "completed", "archived"
	// Token is the run's fencing token (the run taken over, for "taken
	// over"; the run that made it skip, for "skipped"), By the process
	// that wrote the event ("host:pid"), where known.
	Token  int64  `json:",omitzero"`
	By     string `json:",omitzero"`
	Detail string `json:",omitzero"` // what it says: the task and queue, the error, who took the run over and from which token
}

// Occurrence returns the occurrence's name, OccurrenceID(j.ID, j.Due).
func (j JobInfo) Occurrence() string { return OccurrenceID(j.ID, j.Due) }

// OccurrenceID names the occurrence of job id due at due: the id, "@",
// and the due time in UTC to the millisecond, as in
// "order-731@2026-08-29T08:18:20.000Z". The Dispatcher gives each task it
// enqueues this asynq TaskID, and it is the middleware's default key.
func OccurrenceID(id string, due time.Time) string {
	var buf [96]byte
	b := buf[:0]
	if len(id)+25 > len(buf) {
		b = make([]byte, 0, len(id)+25)
	}
	b = append(append(b, id...), '@')
	return string(appendOccurrenceTime(b, due))
}

const occurrenceLayout = "2006-01-02T15:04:05.000Z"

// appendOccurrenceTime appends t as AppendFormat(occurrenceLayout) does, in
// UTC, without reading the layout for years 0 to 9999: the dispatcher
// names every task it enqueues with it.
func appendOccurrenceTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, occurrenceLayout)
	}
	hour, minute, sec := t.Clock()
	two := func(b []byte, v int) []byte { return append(b, byte('0'+v/10), byte('0'+v%10)) }
	b = two(two(b, year/100), year%100)
	b = two(append(b, '-'), int(month))
	b = two(append(b, '-'), day)
	b = two(append(b, 'T'), hour)
	b = two(append(b, ':'), minute)
	b = two(append(b, ':'), sec)
	msec := t.Nanosecond() / 1e6
	return append(b, '.', byte('0'+msec/100), byte('0'+msec/10%10), byte('0'+msec%10), 'Z')
}

// ParseOccurrence reads an occurrence name back into the job id and the
// due time (the id is what comes before the last "@"). It reports false
// for a name OccurrenceID does not make, and for a due time outside the
// years 0 to 9999, whose name it cannot read back.
func ParseOccurrence(name string) (id string, due time.Time, ok bool) {
	i := strings.LastIndexByte(name, '@')
	if i <= 0 {
		return "", time.Time{}, false
	}
	due, ok = parseOccurrenceTime(name[i+1:])
	if !ok || OccurrenceID(name[:i], due) != name {
		return "", time.Time{}, false
	}
	return name[:i], time.UnixMilli(due.UnixMilli()), true
}

// parseOccurrenceTime reads "YYYY-MM-DDTHH:MM:SS.mmmZ" (occurrenceLayout)
// as UTC. Fields out of their range are not checked here: the caller
// compares the name made of the result with what it read.
func parseOccurrenceTime(s string) (time.Time, bool) {
	if len(s) != len(occurrenceLayout) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' ||
		s[19] != '.' || s[23] != 'Z' {
		return time.Time{}, false
	}
	ok := true
	num := func(from, to int) int {
		v := 0
		for _, c := range []byte(s[from:to]) {
			if c < '0' || c > '9' {
				ok = false
			}
			v = 10*v + int(c-'0')
		}
		return v
	}
	t := time.Date(num(0, 4), time.Month(num(5, 7)), num(8, 10), num(11, 13), num(14, 16), num(17, 19),
		num(20, 23)*int(time.Millisecond), time.UTC)
	return t, ok
}

// readable reports whether ParseOccurrence reads the name of an
// occurrence due at due back.
func readable(due time.Time) bool {
	y := due.UTC().Year()
	return y >= 0 && y <= 9999
}

// headerJob is the header of a dispatched asynq task that carries its
// JobInfo where its TaskID does not say it all: the attempt, the
// occurrence's due time in Unix ms and the job id, separated by spaces, as
// in "2 1787991500000 order-731" (the id comes last: it may hold spaces).
// The Dispatcher writes it only for a later attempt, a due time outside the
// years 0 to 9999, or a TaskID that TaskOptions replaced (why:
// docs/performance.md).
const headerJob = "zclaim-job"

// info returns the claim's JobInfo.
func (c Claim) info() JobInfo { return JobInfo{ID: c.ID, Due: c.Due, Attempt: c.Attempt} }

// header returns the value of headerJob that carries j.
func (j JobInfo) header() string {
	b := make([]byte, 0, 24+len(j.ID))
	b = strconv.AppendInt(b, int64(j.Attempt), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, j.Due.UnixMilli(), 10)
	b = append(b, ' ')
	return string(append(b, j.ID...))
}

// JobFromTask returns the JobInfo of a task a Dispatcher enqueued: from its
// headerJob header, else from its TaskID (an occurrence name; the first
// attempt), which asynq gives a task being handled (Task.ResultWriter). It
// reports false for a task with neither.
func JobFromTask(t *asynq.Task) (JobInfo, bool) {
	if t == nil {
		return JobInfo{}, false
	}
	var taskID string
	if w := t.ResultWriter(); w != nil {
		taskID = w.TaskID()
	}
	return jobOf(t, taskID)
}

// jobOf returns the JobInfo of task t whose asynq task id is taskID ("" if
// unknown).
func jobOf(t *asynq.Task, taskID string) (JobInfo, bool) {
	if h, ok := t.Headers()[headerJob]; ok {
		return parseHeader(h)
	}
	if id, due, ok := ParseOccurrence(taskID); ok {
		return JobInfo{ID: id, Due: due, Attempt: 1}, true
	}
	return JobInfo{}, false
}

// parseHeader reads a headerJob value.
func parseHeader(h string) (JobInfo, bool) {
	a, rest, ok := strings.Cut(h, " ")
	if !ok {
		return JobInfo{}, false
	}
	due, id, ok := strings.Cut(rest, " ")
	if !ok || id == "" {
		return JobInfo{}, false
	}
	attempt, err := strconv.Atoi(a)
	if err != nil {
		return JobInfo{}, false
	}
	ms, err := strconv.ParseInt(due, 10, 64)
	if err != nil {
		return JobInfo{}, false
	}
	return JobInfo{ID: id, Due: time.UnixMilli(ms), Attempt: attempt}, true
}

type jobInfoKey struct{}

// JobFromContext returns the JobInfo of the task being handled: the job
// id, its occurrence's due time and the attempt. It is in the context of a
// handler wrapped by Idempotency.Middleware or WithJob, for a task that a
// Dispatcher enqueued; it reports false otherwise.
func JobFromContext(ctx context.Context) (JobInfo, bool) {
	j, ok := ctx.Value(jobInfoKey{}).(JobInfo)
	return j, ok
}

// jobIn is JobFromTask for the task of a handler's context, which holds
// its task id even where another middleware passed on a task of its own
// making, without asynq's ResultWriter.
func jobIn(ctx context.Context, t *asynq.Task) (JobInfo, bool) {
	if id, ok := asynq.GetTaskID(ctx); ok && t != nil {
		return jobOf(t, id)
	}
	return JobFromTask(t)
}

// withJob returns ctx carrying t's JobInfo, if it has one.
func withJob(ctx context.Context, t *asynq.Task) context.Context {
	if j, ok := jobIn(ctx, t); ok {
		return context.WithValue(ctx, jobInfoKey{}, j)
	}
	return ctx
}

// WithJob is asynq middleware that puts each dispatched task's JobInfo into
// its handler's context (JobFromContext), for handlers that are not wrapped
// by Idempotency.Middleware, which does the same.
func WithJob(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		return next.ProcessTask(withJob(ctx, t), t)
	})
}

// OccurrenceKey is the middleware's default Key function: the occurrence
// of a task a Dispatcher enqueued (JobFromTask), else the asynq task id.
func OccurrenceKey(ctx context.Context, t *asynq.Task) (string, error) {
	if j, ok := jobIn(ctx, t); ok {
		return j.Occurrence(), nil
	}
	return taskIDKey(ctx, t)
}

// taskIDKey is a Key function that names the work by the asynq task id
// alone (for a dispatched task, its occurrence as well).
func taskIDKey(ctx context.Context, _ *asynq.Task) (string, error) {
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return "", errors.New("zclaim: no asynq task id in the context")
	}
	return id, nil
}

// JobState is where a job is.
type JobState int

// The states of a job. The zero value is StateUnknown: a JobInfo from
// JobFromContext does not say, since the task a handler runs has left
// the schedule.
const (
	StateUnknown   JobState = iota
	StateScheduled          // on the schedule, waiting for its due time (or due and not yet claimed)
	StateInFlight           // claimed, under a lease
	StateDead               // in the dead set
	StateRunning            // its asynq task's handler runs under the middleware (BrokerOptions.Runs)
	StateAbandoned          // its asynq task's worker is gone; a takeover starts it again (BrokerOptions.Runs)
	StateEnqueued           // a Dispatcher made it an asynq task (BrokerOptions.History): TaskState says where that is
)

// String returns "scheduled", "in flight", "dead", "running", "abandoned",
// "enqueued" or "unknown".
func (s JobState) String() string {
	switch s {
	case StateEnqueued:
		return "enqueued"
	case StateRunning:
		return "running"
	case StateAbandoned:
		return "abandoned"
	case StateScheduled:
		return "scheduled"
	case StateInFlight:
		return "in flight"
	case StateDead:
		return "dead"
	}
	return "unknown"
}

// MarshalText writes the state as String does, for JSON.
func (s JobState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText writes.
func (s *JobState) UnmarshalText(b []byte) error {
	for _, st := range []JobState{StateUnknown, StateScheduled, StateInFlight, StateDead,
		StateRunning, StateAbandoned, StateEnqueued} {
		if st.String() == string(b) {
			*s = st
			return nil
		}
	}
	return zerr("zclaim: %w: job state %q", ErrInvalidArgument, b)
}

// Takeover says who took a run over from its dead worker, and when (the
// key's history keeps it: takeover.lua writes it).
type Takeover struct {
	At     time.Time     // by the taker's clock
	By     string        // the taking process: "host:pid"
	From   int64         `json:",omitzero"` // the dead run's token (0: its run never began)
	Silent time.Duration // how long the dead run had been silent
}

// String says who took the run over, from what and after how long, as
// "by host:pid, from token 123, silent 5.1s" (without the time, At).
func (t Takeover) String() string {
	from := "its run had not begun"
	if t.From != 0 {
		from = "from token " + strconv.FormatInt(t.From, 10)
	}
	return "by " + t.By + ", " + from + ", silent " + t.Silent.Round(time.Millisecond).String()
}
