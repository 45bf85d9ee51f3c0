package zclaim

// Periodic jobs: definitions kept with the schedule, each with one tick
// on it at a time, dispatched once however many dispatchers run.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// PeriodicPrefix begins the job id of every tick of a periodic
// definition: "periodic:<name>". Schedule refuses ids that begin with it.
// A tick carries its definition's type; a member with the prefix and no
// type (another producer's plain ZADD) is that producer's job, dispatched
// as any other, and the tick of a definition deleted while it was in
// flight is dropped by the dispatcher, with an Info log.
const PeriodicPrefix = "periodic:"

// MissedTicks says what a definition does with ticks no dispatcher ran in
// time (all dispatchers down across several ticks).
type MissedTicks int

const (
	// RunLatest runs the most recent missed tick once and goes on from
	// there; the earlier missed ones do not run.
	RunLatest MissedTicks = iota
	// SkipMissed runs none of the missed ticks and goes on from the next
	// one to come.
	SkipMissed
)

// Periodic is a job that runs on a schedule of its own: one asynq task per
// tick, whatever the number of dispatchers.
type Periodic struct {
	// Name names the definition; its ticks are the job "periodic:<Name>",
	// and each tick is the occurrence of that id at the tick's time.
	Name string
	// Spec is when it ticks, in cron syntax as asynq's Scheduler takes
	// it: five fields ("*/5 * * * *"), descriptors ("@hourly",
	// "@every 30s"), and also six fields with seconds first
	// ("*/10 * * * * *").
	Spec string
	// Type, Queue and Payload make each tick's asynq task.
	Type    string
	Queue   string
	Payload []byte
	// Location is the time zone of Spec's fields. Default: UTC.
	Location *time.Location
	// Missed says what happens to ticks missed while no dispatcher ran.
	// Default: RunLatest.
	Missed MissedTicks
}

// PeriodicInfo is a stored definition and its next tick.
type PeriodicInfo struct {
	Periodic
	Next time.Time // the tick on the schedule (or being dispatched); zero if none
	// Err is set for a definition this process cannot read (ErrCorrupt):
	// its time zone does not load here, or SetPeriodic did not write it.
	// Periodic then holds what could be read (Name at least, no Location).
	Err error
}

// periodicDef is a Periodic as stored (JSON, fields in a fixed order).
type periodicDef struct {
	Spec    string `json:"spec"`
	TZ      string `json:"tz"`
	Type    string `json:"type"`
	Queue   string `json:"queue,omitempty"`
	Payload []byte `json:"payload,omitempty"`
	Missed  string `json:"missed,omitempty"`
}

var cronParser = cron.NewParser(
	cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parse reads a stored definition back, with its schedule.
func (d periodicDef) parse(name string) (Periodic, cron.Schedule, error) {
	p := Periodic{Name: name, Spec: d.Spec, Type: d.Type, Queue: d.Queue, Payload: d.Payload}
	if d.Missed == "skip" {
		p.Missed = SkipMissed
	}
	loc, err := time.LoadLocation(d.TZ)
	if err != nil {
		return p, nil, fmt.Errorf("%w: periodic %q: time zone %q does not load in this process "+
			"(install the system's tzdata, or import time/tzdata in the program): %v", ErrCorrupt, name, d.TZ, err)
	}
	p.Location = loc
	s, err := p.schedule()
	return p, s, err
}

func (p Periodic) schedule() (cron.Schedule, error) {
	loc := p.Location
	if loc == nil {
		loc = time.UTC
	}
	spec := p.Spec
	if !strings.HasPrefix(spec, "@") {
		spec = "CRON_TZ=" + loc.String() + " " + spec
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: periodic %q: spec %q: %v", ErrInvalidArgument, p.Name, p.Spec, err)
	}
	return s, nil
}

func (p Periodic) validate() error {
	switch {
	case p.Name == "":
		return fmt.Errorf("%w: periodic definition without a Name", ErrInvalidArgument)
	case len(PeriodicPrefix)+len(p.Name) > MaxIDLen:
		return fmt.Errorf("%w: periodic %q: %w", ErrInvalidArgument, p.Name, ErrIDTooLong)
	case blank(p.Type):
		return fmt.Errorf("%w: periodic %q: a Type is needed for its tasks", ErrInvalidArgument, p.Name)
	case p.Queue != "" && blank(p.Queue):
		return fmt.Errorf("%w: periodic %q: a queue name of white space", ErrInvalidArgument, p.Name)
	case len(p.Type)+len(p.Queue)+len(p.Payload) > MaxPayloadLen:
		return fmt.Errorf("%w: periodic %q: %w", ErrInvalidArgument, p.Name, ErrPayloadTooLarge)
	case p.Missed != RunLatest && p.Missed != SkipMissed:
		return fmt.Errorf("%w: periodic %q: Missed %d", ErrInvalidArgument, p.Name, p.Missed)
	case p.Location != nil && p.Location.String() == "Local":
		return fmt.Errorf("%w: periodic %q: time.Local differs between machines; name the zone (time.LoadLocation)",
			ErrInvalidArgument, p.Name)
	}
	_, err := p.schedule()
	return err
}

func (p Periodic) def() periodicDef {
	d := periodicDef{Spec: p.Spec, TZ: "UTC", Type: p.Type, Queue: p.Queue, Payload: p.Payload}
	if p.Location != nil {
		d.TZ = p.Location.String()
	}
	if p.Missed == SkipMissed {
		d.Missed = "skip"
	}
	return d
}

// timing is what, when it changes, moves the next tick.
func (d periodicDef) timing() string { return d.Spec + "\x1f" + d.TZ }

// periodicKeys are the keys of a definition: those of its tick's shard.
func (k *keys) periodicKeys() []string {
	return []string{k.schedule, k.pending, k.periodic, k.ticks}
}

// periodicShard returns the keys of the shard of definition name's ticks.
func (b *Broker) periodicShard(name string) *keys { return b.shardOf(PeriodicPrefix + name) }

// SetPeriodic stores periodic definitions with the schedule, by name:
// every replica of a service may call it at start-up with the same
// definitions, and a definition that is already stored as given changes
// nothing. A new definition, or one whose Spec or Location changed, gets
// its next tick after now (by Redis' clock) on the schedule, replacing the
// one there; a change to its Type, Queue, Payload or Missed applies to the
// tick already scheduled. A definition whose tick is gone (cancelled,
// dead) gets a new one. Ticks are dispatched by Dispatchers (not by
// Broker.Claim callers), each once. The call is atomic (with Shards,
// shard by shard).
func (b *Broker) SetPeriodic(ctx context.Context, defs ...Periodic) error {
	if err := ctx.Err(); err != nil {
		return wrap(ctx, "set periodic", err, nil)
	}
	seen := map[string]bool{}
	for _, p := range defs {
		if err := p.validate(); err != nil {
			return zerr("zclaim: set periodic: %w", err)
		}
		if seen[p.Name] {
			return zerr("zclaim: set periodic: %w: name %q given twice", ErrInvalidArgument, p.Name)
		}
		seen[p.Name] = true
	}
	if len(defs) == 0 {
		return nil
	}
	now, err := b.rdb.Time(ctx).Result()
	if err != nil {
		return wrap(ctx, "set periodic", err, nil)
	}
	stale := now.Add(-b.opts.Lease - time.Minute).UnixMilli()
	byName := map[string]Periodic{}
	names := make([]string, 0, len(defs))
	for _, p := range defs {
		byName[p.Name] = p
		names = append(names, PeriodicPrefix+p.Name)
	}
	return b.byShard(names, func(k *keys, ids []string) error {
		args := []any{"set", b.notice(k), stale}
		for _, id := range ids {
			p := byName[strings.TrimPrefix(id, PeriodicPrefix)]
			s, _ := p.schedule()
			d := p.def()
			js, _ := json.Marshal(d)
			next := s.Next(now)
			args = append(args, p.Name, string(js), d.timing(), next.UnixMilli(), b.score(next),
				encodeRest(p.Type, p.Queue, p.Payload, nil))
		}
		if err := b.repl.run(ctx, b.rdb, periodicScript, k.periodicKeys(), args...).Err(); err != nil {
			return wrap(ctx, "set periodic", err, k.types)
		}
		return nil
	})
}

// DeletePeriodic removes a definition and its scheduled tick. A tick
// being dispatched at that moment still runs. It reports whether the
// definition existed.
func (b *Broker) DeletePeriodic(ctx context.Context, name string) (bool, error) {
	if err := checkID(ctx, "delete periodic", name); err != nil {
		return false, err
	}
	k := b.periodicShard(name)
	n, err := b.repl.run(ctx, b.rdb, periodicScript, k.periodicKeys(), "delete", name).Int()
	if err != nil {
		return false, wrap(ctx, "delete periodic", err, k.types)
	}
	return n == 1, nil
}

// ListPeriodic returns the stored definitions, with their next ticks; one
// this process cannot read is listed with its Err.
func (b *Broker) ListPeriodic(ctx context.Context) ([]PeriodicInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrap(ctx, "list periodic", err, nil)
	}
	var out []PeriodicInfo
	for i, cmd := range b.eachShard(ctx, periodicScript,
		func(k *keys) ([]string, []any) { return k.periodicKeys(), []any{"list"} }) {
		raw, err := cmd.Slice()
		if err != nil {
			return nil, wrap(ctx, "list periodic", err, b.shards[i].types)
		}
		for i := 0; i+2 < len(raw); i += 3 {
			name, _ := raw[i].(string)
			js, _ := raw[i+1].(string)
			var d periodicDef
			p, _, err := d.parseJSON(js, name)
			p.Name = name
			info := PeriodicInfo{Periodic: p, Err: err}
			if mark, ok := raw[i+2].(string); ok {
				ms, _, _ := strings.Cut(mark, " ")
				if v, err := strconv.ParseInt(ms, 10, 64); err == nil {
					info.Next = time.UnixMilli(v)
				}
			}
			out = append(out, info)
		}
	}
	return out, nil
}

// tick is what a dispatcher does with a claimed tick of a periodic
// definition before it enqueues it: it reads the definition, decides
// which tick to run (the claimed one; after downtime the latest missed one,
// or none under SkipMissed; c.Due becomes the tick run) and returns the
// function that writes the next tick, to call once the run is enqueued
// (or, with run false, at once). The next tick is written only while the
// definition's mark is still the claimed tick: a second claim of the same
// tick (after recovery) or a changed Spec writes none.
//
// A definition this process cannot read (Redis did not answer, its time
// zone does not load here, it is not one SetPeriodic wrote) gives err: the
// tick goes back after its backoff, for a later claim here or in another
// dispatcher, rather than run with no next tick written, which would end
// the definition's chain of ticks until SetPeriodic mends it. After its
// last attempt it goes to the dead set, where it shows.
func (d *Dispatcher) tick(ctx context.Context, c *Claim, now time.Time) (run bool, advance func() error, err error) {
	b := d.b
	name := strings.TrimPrefix(c.ID, PeriodicPrefix)
	k := b.claimKeys(*c)
	raw, err := replication{}.run(ctx, b.rdb, periodicScript, k.periodicKeys(), "get", name).Slice()
	if err == nil && len(raw) != 2 {
		err = fmt.Errorf("%w: periodic %q: a reply of %d values", ErrCorrupt, name, len(raw))
	}
	if err != nil {
		d.log.LogAttrs(ctx, slog.LevelWarn,
			"zclaim: could not read a periodic definition; its tick goes back with backoff",
			slog.String("name", name), slog.String("error", err.Error()))
		return false, nil, err
	}
	js, ok := raw[0].(string)
	if !ok {
		d.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: tick of a deleted periodic definition dropped",
			slog.String("name", name))
		return false, func() error { return nil }, nil
	}
	var def periodicDef
	p, s, err := def.parseJSON(js, name)
	if err != nil {
		d.log.LogAttrs(ctx, slog.LevelError,
			"zclaim: periodic definition cannot be read here; its tick goes back with backoff",
			slog.String("name", name), slog.String("error", err.Error()))
		return false, nil, err
	}
	claimed := c.Due
	at := claimed
	run = true
	if next := s.Next(at); !next.After(now) { // missed ticks: the dispatchers were down
		if p.Missed == SkipMissed {
			run, at = false, now
		} else {
			at = latestTick(s, at, now)
		}
		d.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: periodic ticks were missed",
			slog.String("name", name), slog.Time("from", claimed), slog.Time("now", now), slog.Bool("ran_latest", run))
	}
	if run && !at.Equal(claimed) {
		c.Due = at
	}
	after := s.Next(at)
	return run, func() error {
		err := b.repl.run(ctx, b.rdb, periodicScript, k.periodicKeys(), "advance", b.notice(k), name,
			claimed.UnixMilli(), after.UnixMilli(), b.score(after), encodeRest(p.Type, p.Queue, p.Payload, nil)).Err()
		if err != nil {
			d.log.LogAttrs(ctx, slog.LevelWarn,
				"zclaim: could not write a periodic definition's next tick; the tick goes back with backoff",
				slog.String("name", name), slog.String("error", err.Error()))
		}
		return err
	}, nil
}

func (d *periodicDef) parseJSON(js, name string) (Periodic, cron.Schedule, error) {
	if err := json.Unmarshal([]byte(js), d); err != nil {
		return Periodic{}, nil, fmt.Errorf("%w: periodic %q: %v", ErrCorrupt, name, err)
	}
	return d.parse(name)
}

// latestTick returns the last tick of s at or before now, starting from a
// tick at from. It walks tick by tick for up to latestWalk ticks; beyond,
// it looks back from now, twice as far each time, until a tick lies
// between, and walks on from there (an @every schedule's ticks then keep
// time with now rather than with from).
func latestTick(s cron.Schedule, from, now time.Time) time.Time {
	t := from
	for range latestWalk {
		n := s.Next(t)
		if n.After(now) {
			return t
		}
		t = n
	}
	for back := time.Second; back < now.Sub(t); back *= 2 {
		if n := s.Next(now.Add(-back)); !n.After(now) {
			t = n
			break
		}
	}
	for n := s.Next(t); !n.After(now); n = s.Next(t) {
		t = n
	}
	return t
}

// latestWalk is how many missed ticks latestTick walks one by one.
const latestWalk = 1000
