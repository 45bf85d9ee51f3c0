// Package zclaim is the delayed-job and exactly-once layer for asynq on Redis.
//
// Many teams keep delayed jobs in a Redis sorted set (member = job id,
// score = due time) and poll it with ZRANGEBYSCORE followed by ZREM; two
// pollers read the same member before either removes it, and the job runs
// twice. zclaim gives such a set four things:
//
//   - A [Broker] that claims due jobs atomically in one Lua script, by
//     Redis' own clock, and leases each claim under a fencing token that
//     only grows. [Broker.Ack], [Broker.Extend], [Broker.Retry] and
//     [Broker.Kill] succeed only for the holder of the current token; a
//     holder whose lease was recovered gets [ErrLeaseLost].
//   - Recovery ([Broker.Recover], [Broker.RunRecovery]): a run whose lease
//     expired goes back to the schedule after a backoff, or into a dead set
//     after its last attempt. Nothing is lost: [Broker.List] with
//     [StateDead] lists the dead set, [Broker.Revive] puts its jobs back,
//     [Broker.DeleteDead] forgets them. Like asynq's archive, the dead set keeps at most 10,000 jobs
//     for 90 days by default (BrokerOptions.DeadMax, DeadRetention); the
//     recovery pass trims it.
//   - An idempotency store and asynq middleware that keep one live run per
//     occurrence, skip runs of occurrences that already finished, and take
//     over the runs of dead workers within about a lease, spending no
//     retry. Effects in PostgreSQL commit with the occurrence's done mark
//     through the zclaimpg module, so that each happens once even when
//     Redis loses or rolls back its data.
//   - A dispatcher that turns due jobs into asynq tasks the moment they
//     are due. Its claims are leased a batch at a time, renewed while
//     their enqueues go on, and settled as one.
//
// # Occurrences
//
// The unit of work is an occurrence: a job id together with the due time it
// was first scheduled for ([JobInfo], [OccurrenceID]). A member scheduled
// again after it ran, at any due time, is new work and runs again; every
// duplicate of one occurrence (a re-dispatch after a dispatcher died, a
// second asynq task for it, the same ZADD repeated) runs at most once. A
// retry's backoff moves the job but keeps its occurrence. The dispatcher's
// asynq TaskID names the occurrence and carries the job (a header too
// where the TaskID does not say it all: [headerJob]);
// handlers read it with [JobFromContext].
//
// # Keys
//
// A schedule is named by one key (BrokerOptions.Key, default
// "zclaim:{default}"). The other keys are derived from it and share its
// Redis Cluster hash slot: a key with a hash tag keeps it
// ("zclaim:{orders}:inflight"); a key without one is wrapped in braces
// ("delay:jobs" -> "{delay:jobs}:inflight"), which hashes like the key
// itself, so producers that write "delay:jobs" need not change. Job ids are
// members and hash fields, never parts of key names.
//
// # Scores
//
// Scores are Unix seconds by default, fractions allowed: ZADD delay:jobs
// 1787991500 order-731 keeps working, and jobs scheduled through zclaim get
// millisecond precision (1787991500.25), rounded up so a job never comes due
// early. A set scored in Unix milliseconds is adopted with
// BrokerOptions.ScoreUnit = time.Millisecond. Members written by other
// programs have no type or payload; they are claimed with empty ones.
//
// # Runs of one id
//
// Scheduling an id that is already scheduled (not yet claimed) replaces its
// due time and payload: a new occurrence. Scheduling an id that is in
// flight adds a new run beside the one in flight; each run keeps its own
// payload, and one run's Ack never removes the other's. When a run comes
// back (Retry, or an expired lease) while the id is scheduled again, the
// newer entry stands for the work and is left as it is.
//
// # Errors
//
// Errors carry the prefix "zclaim:" and match the package's Err values with
// errors.Is: bad input ([ErrEmptyID], [ErrIDTooLong], [ErrPayloadTooLarge],
// [ErrUnfitForAsynq], [ErrNoRunAt], [ErrRunAtRange] inside a [*JobError];
// [ErrInvalidArgument]), a key holding
// another Redis type ([*WrongTypeError], matching [ErrWrongType], naming the
// key), a lost lease ([ErrLeaseLost], in a [*LeaseLostError] that names the
// operation and the job), a server that lost zclaim's keys or went back to
// an older state ([ErrStateLost]),
// one that may evict them ([ErrEvictionPolicy]), a write its replicas did
// not acknowledge ([ErrNotReplicated]), and a Schedule that failed part-way
// ([*ScheduleError]). A cancelled context comes back matching
// context.Canceled. Bad input changes nothing.
//
// # Logs
//
// A nil Logger in the options means none: zclaim is quiet unless given a
// logger (slog.Default(), say). A Dispatcher logs to its Broker's logger
// unless it has its own.
package zclaim
