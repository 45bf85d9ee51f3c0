package zclaim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrLeaseLost is returned by Ack, Extend, Retry and Kill (and by an
	// Execution's Extend, Complete and Release) when the caller's fencing
	// token is no longer the current one: its lease expired and the work was
	// recovered, or it was settled already. Nothing was changed. A
	// Dispatcher's OnDispatch gets it for a claim whose lease ran out
	// before its enqueue, which it did not make.
	ErrLeaseLost = errors.New("zclaim: lease lost")

	// ErrInvalidJob is wrapped by a *JobError for a job that Schedule refuses.
	ErrInvalidJob = errors.New("zclaim: invalid job")
	// ErrEmptyID: a job id (or idempotency key) is empty.
	ErrEmptyID = errors.New("zclaim: empty id")
	// ErrIDTooLong: a job id is longer than MaxIDLen bytes.
	ErrIDTooLong = fmt.Errorf("zclaim: id longer than %d bytes", MaxIDLen)
	// ErrUnfitForAsynq: a job id, type or queue that asynq refuses (not
	// valid UTF-8, or only white space), so the job could never become a
	// task.
	ErrUnfitForAsynq = errors.New("zclaim: asynq refuses it")
	// ErrPayloadTooLarge: a job's Type, Queue and Payload together exceed MaxPayloadLen bytes.
	ErrPayloadTooLarge = fmt.Errorf("zclaim: payload larger than %d bytes", MaxPayloadLen)
	// ErrNoRunAt: a job has a zero RunAt.
	ErrNoRunAt = errors.New("zclaim: zero RunAt")
	// ErrRunAtRange: a time is further from 1970 than a score holds to the
	// millisecond: 100,000 years either way.
	ErrRunAtRange = errors.New("zclaim: time out of range: a score holds times within 100,000 years " +
		"of 1970 to the millisecond")
	// ErrInvalidArgument: an argument is out of range (a claim max <= 0, an
	// extension <= 0, a claim with no id or token).
	ErrInvalidArgument = errors.New("zclaim: invalid argument")
	// ErrReservedID: a job id that begins with PeriodicPrefix, which the
	// ticks of periodic definitions use.
	ErrReservedID = errors.New("zclaim: job id begins with \"periodic:\", which is kept for periodic definitions")
	// ErrReservedKey is returned by Begin for an idempotency key that
	// begins with a NUL byte and "done": the names of a store's own keys.
	ErrReservedKey = errors.New("zclaim: idempotency key reserved for the store's own records")
	// ErrShards: a Broker's Shards differs from the count the schedule was
	// made with, or Shards > 1 names a key that holds a set already.
	ErrShards = errors.New("zclaim: shard count")
	// ErrNotFound: Broker.Job found no entry of the id.
	ErrNotFound = errors.New("zclaim: job not found")
	// ErrInvalidOptions: an options struct holds a value out of range.
	ErrInvalidOptions = errors.New("zclaim: invalid options")
	// ErrStateLost: the keys zclaim wrote are gone: the server restarted
	// without them, was flushed, or failed over to a replica that lacked
	// them. Claims and runs made before are void.
	ErrStateLost = errors.New("zclaim: the state in Redis was lost")
	// ErrWrongType is matched by a *WrongTypeError.
	ErrWrongType = errors.New("zclaim: key holds the wrong Redis type")
	// ErrMisuse is matched by errors that name a misuse of zclaim or of a
	// module of it that repeats or loses work (zclaimpg.ErrTxDone: a
	// Complete after the commit). The middleware logs a handler error
	// that matches it at Error.
	ErrMisuse = errors.New("zclaim: misuse")
	// ErrCorrupt: a value read back from Redis cannot be decoded.
	ErrCorrupt = errors.New("zclaim: corrupt value")
)

// JobError tells which job of a Schedule call was refused and why.
// errors.Is(err, ErrInvalidJob) and errors.Is(err, Err) both hold.
type JobError struct {
	Index int    // position in the Schedule call
	ID    string // the job's id (possibly truncated for display)
	Err   error  // ErrEmptyID, ErrIDTooLong, ErrPayloadTooLarge, ErrNoRunAt or ErrRunAtRange
}

func (e *JobError) Error() string {
	id := e.ID
	if len(id) > 64 {
		id = id[:64] + "..."
	}
	return fmt.Sprintf("zclaim: job %d (%q): %s", e.Index, id, strings.TrimPrefix(e.Err.Error(), "zclaim: "))
}

func (e *JobError) Unwrap() []error { return []error{ErrInvalidJob, e.Err} }

// LeaseLostError is the error of Ack, Extend, Retry or Kill for a claim
// whose token is no longer current. It matches ErrLeaseLost, and
// ErrStateLost too when the server lost the schedule's state since the
// claim was made (no other worker holds the job then: the server forgot
// it). Nothing was changed.
type LeaseLostError struct {
	Op        string // "ack", "extend", "retry" or "kill"
	ID        string // the job id
	StateLost bool
}

func (e *LeaseLostError) Error() string {
	if e.StateLost {
		return fmt.Sprintf("zclaim: %s %s: lease lost: the server lost the schedule's state since the claim", e.Op,
			e.ID)
	}
	return fmt.Sprintf("zclaim: %s %s: lease lost", e.Op, e.ID)
}

func (e *LeaseLostError) Is(target error) bool {
	return target == ErrLeaseLost || (e.StateLost && target == ErrStateLost)
}

// ScheduleError reports a Schedule call that failed while writing: the
// first Written jobs of the call are on the schedule, the others are not,
// except that the chunk being written when the reply was lost (a dropped
// connection, a timeout) may be, whole: each chunk is written atomically.
// Scheduling a job again with the same RunAt is the same occurrence, so
// Schedule(ctx, jobs[Written:]...) completes the call safely. With
// BrokerOptions.Shards above 1 the jobs are written per shard and
// Written counts them: scheduling the whole call again is what is safe.
// Unwrap gives the cause.
type ScheduleError struct {
	Written int   // jobs[:Written] are scheduled (with Shards > 1: how many)
	Total   int   // len(jobs)
	Err     error // the cause, from Redis or the context
}

func (e *ScheduleError) Error() string {
	return fmt.Sprintf("zclaim: schedule: %d of %d jobs written: %s", e.Written, e.Total,
		strings.TrimPrefix(e.Err.Error(), "zclaim: schedule: "))
}

func (e *ScheduleError) Unwrap() error { return e.Err }

// QueueError names an asynq queue whose active tasks could not be listed
// (its keys of another type than asynq writes, say): Idempotency.Runs and
// the takeover loop pass over it and read the other queues. Unwrap gives
// the cause.
type QueueError struct {
	Queue string
	Err   error
}

func (e *QueueError) Error() string {
	return fmt.Sprintf("zclaim: asynq queue %q cannot be read: %v", e.Queue, e.Err)
}

func (e *QueueError) Unwrap() error { return e.Err }

// WrongTypeError names a key that holds another Redis type than the one
// zclaim needs. The script that found it wrote nothing.
type WrongTypeError struct {
	Key  string // the key
	Want string // the type zclaim needs: "zset", "hash" or "string"
	Got  string // the type the key holds
}

func (e *WrongTypeError) Error() string {
	if e.Want == "" {
		return fmt.Sprintf("zclaim: key %q holds a %s", e.Key, e.Got)
	}
	return fmt.Sprintf("zclaim: key %q holds a %s, want a %s", e.Key, e.Got, e.Want)
}

func (e *WrongTypeError) Is(target error) bool { return target == ErrWrongType }

// wrap gives an error from Redis or the context the package prefix and the
// operation's name; ctx errors stay matchable with errors.Is.
func wrap(ctx context.Context, op string, err error, want map[string]string) error {
	if err == nil {
		return nil
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if key, ok := strings.CutPrefix(msg, "ZCLAIM_CORRUPT "); ok {
			return zerr("zclaim: %s: %w: key %q", op, ErrCorrupt, key)
		}
		if rest, ok := strings.CutPrefix(msg, "ZCLAIM_WRONGTYPE "); ok {
			i := strings.LastIndexByte(rest, ' ')
			if i > 0 {
				key := rest[:i]
				return &WrongTypeError{Key: key, Got: rest[i+1:], Want: want[key]}
			}
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = errors.Join(cerr, err)
	}
	// One prefix: an error of zclaim's own already carries it.
	return &opError{msg: "zclaim: " + op + ": " + strings.TrimPrefix(err.Error(), "zclaim: "), err: err}
}

// zerr is fmt.Errorf for zclaim's own messages: the errors it wraps keep
// matching with errors.Is, and their "zclaim: " prefixes are said once.
func zerr(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "zclaim: "); ok {
		msg = "zclaim: " + strings.ReplaceAll(rest, "zclaim: ", "")
	}
	return &opError{msg: msg, err: err}
}

// opError is an error with the operation's name before it.
type opError struct {
	msg string
	err error
}

func (e *opError) Error() string { return e.msg }
func (e *opError) Unwrap() error { return e.err }

const (
	// MaxIDLen is the longest job id, in bytes.
	MaxIDLen = 512
	// MaxPayloadLen bounds a job's Type, Queue and Payload together, in bytes.
	MaxPayloadLen = 1 << 20
)

// orDefault sets an option left at its zero value to its default d.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// checkID checks a job id (or idempotency key) against the documented
// limits, and the context.
func checkID(ctx context.Context, op, id string) error {
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err, nil)
	}
	if id == "" {
		return zerr("zclaim: %s: %w", op, ErrEmptyID)
	}
	if len(id) > MaxIDLen {
		return zerr("zclaim: %s: %w", op, ErrIDTooLong)
	}
	return nil
}

// unfitForAsynq says why an asynq task of id, type typ and queue q could
// never be enqueued (asynq refuses its TaskID, type or queue before it
// writes anything), or "" when it could. An empty type or queue means the
// dispatcher's defaults.
func unfitForAsynq(id, typ, q string) string {
	switch {
	case id == "":
		return "empty job id"
	case len(id) > MaxIDLen:
		return fmt.Sprintf("job id of %d bytes, longer than MaxIDLen (%d)", len(id), MaxIDLen)
	case !utf8.ValidString(id):
		return "job id is not valid UTF-8 (asynq task ids must be)"
	case blank(id):
		return "job id of white space only (asynq refuses such a task id)"
	case !utf8.ValidString(typ):
		return "task type is not valid UTF-8"
	case typ != "" && blank(typ):
		return "task type of white space only (asynq refuses it)"
	case !utf8.ValidString(q):
		return "queue name is not valid UTF-8"
	case q != "" && blank(q):
		return "queue name of white space only (asynq refuses it)"
	}
	return ""
}

// blank is asynq's test of a task type, task id or queue name it refuses.
func blank(s string) bool { return strings.TrimSpace(s) == "" }
