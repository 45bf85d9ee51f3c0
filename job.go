package zclaim

// The values a schedule holds and hands out: a Job, and a Claim of it
// under a lease.

import (
	"strconv"
	"time"
)

// Job is one piece of work on the schedule. Its ID is the member of the
// schedule set; together with the due time it is first scheduled for, it
// names an occurrence (see JobInfo), the unit that runs once: the asynq
// TaskID when dispatched and the middleware's default key.
type Job struct {
	ID      string
	RunAt   time.Time
	Type    string // asynq task type, used when dispatched
	Payload []byte
	Queue   string // asynq queue; "" means "default"
	// Headers travel with the job: kept in its record and copied into
	// the asynq task's headers when dispatched (a trace's context, as
	// zclaimotel.Inject writes it). Names beginning with "zclaim-" are
	// the dispatcher's. They count toward MaxPayloadLen.
	Headers map[string]string
}

// Claim is a job taken off the schedule by one claimer, with a lease.
type Claim struct {
	Job
	// Token is the fencing token of this claim: strictly increasing per
	// schedule and never reused. Ack, Extend, Retry and Kill succeed only
	// while it is current.
	Token int64
	// Attempt is 1 on the first claim of a job, 2 on the claim after one
	// retry or one expired lease, and so on.
	Attempt int
	// Due is the due time of the claim's occurrence (see JobInfo), to the
	// millisecond: the time the job was first scheduled for, which a
	// retry's backoff does not move. RunAt is this claim's own due time:
	// its score in the schedule, except on a first attempt of a job written
	// by Schedule, which reads it from the job's record (what Schedule
	// wrote: the same time, unless another program has since moved the
	// member with a ZADD of its own).
	Due time.Time
	// LeaseUntil is the lease deadline by Redis' clock. After it, recovery
	// may take the job back and void Token. The claims of one
	// Broker.Claim call (from one shard) share one lease: Extend of any of
	// them moves the deadline of those not settled yet.
	LeaseUntil time.Time

	state string     // the schedule's state marker when claimed
	mdue  string     // the occurrence's due score when it rides in the in-flight member
	shard int        // the shard it was claimed from
	lease batchLease // the lease it shares with the claims of its call; n = 0: its own in-flight member
	place int        // its place in the lease, from 1
	at    int        // where its entry starts in the lease's jobs (see prelude.lua), from 1
}

// member is the claim's entry in the in-flight set (see claim.lua).
func (c Claim) member() string {
	m := c.ID + "|" + strconv.FormatInt(c.Token, 10)
	if c.mdue != "" {
		m += "@" + c.mdue
	}
	return m
}

// batchLease names the lease of a batch claim: the token of its first job
// and the number of jobs.
type batchLease struct {
	first int64
	n     int
	shard int
}

func (l batchLease) member() string { return strconv.FormatInt(l.first, 10) + ":" + strconv.Itoa(l.n) }
