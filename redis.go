package zclaim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/redisinfo"
)

// What zclaim needs from the Redis server that holds its keys, checked
// when a Broker or an Idempotency store is made and again while it runs.

var (
	// ErrEvictionPolicy: the server may evict keys (a maxmemory-policy other
	// than noeviction), which loses jobs and run records in silence.
	ErrEvictionPolicy = errors.New("zclaim: the Redis server may evict keys")
	// ErrNotReplicated: a write reached the primary but not the replicas
	// that BrokerOptions.WaitReplicas (or IdempotencyOptions.WaitReplicas)
	// asks for within WaitTimeout; a failover now could lose it.
	ErrNotReplicated = errors.New("zclaim: write not acknowledged by enough replicas")
)

// serverNode returns the client of the server that holds key: rdb itself,
// or on Redis Cluster the master of key's slot.
func serverNode(ctx context.Context, rdb redis.UniversalClient, key string) (redis.UniversalClient, error) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return rdb, nil
}

// checkServer reads the eviction policy and persistence of the server
// that holds key (INFO, which works where CONFIG is renamed). It returns
// an error matching ErrEvictionPolicy for a policy that may evict, unless
// allow, in which case it logs a warning. It warns when the server
// persists nothing. A server it cannot ask (unreachable, INFO refused) is
// logged and passed: the caller checks again later.
func checkServer(ctx context.Context, rdb redis.UniversalClient, key string, allow,
	startup bool, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, err := serverNode(ctx, rdb, key)
	var info string
	if err == nil {
		info, err = node.Info(ctx, "memory", "persistence").Result()
	}
	if err != nil {
		if startup {
			log.LogAttrs(ctx, slog.LevelWarn,
				"zclaim: could not read the server's eviction policy; checking again later",
				slog.String("key", key), slog.String("error", err.Error()))
		}
		return nil
	}
	policy := infoField(info, "maxmemory_policy")
	if policy != "" && policy != "noeviction" {
		if !allow {
			return fmt.Errorf("%w: maxmemory-policy is %s, under which Redis deletes keys when memory runs short, "+
				"and jobs or run records vanish without an error (key %q); "+
				"set it to noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf), "+
				"or set AllowEviction in the options to accept that risk", ErrEvictionPolicy, policy, key)
		}
		if startup {
			log.LogAttrs(ctx, slog.LevelWarn,
				"zclaim: the Redis server may evict keys; jobs or run records can vanish (AllowEviction is set)",
				slog.String("key", key), slog.String("maxmemory_policy", policy))
		}
	}
	if startup && infoField(info, "aof_enabled") == "0" {
		save, err := node.ConfigGet(ctx, "save").Result()
		switch {
		case err == nil && strings.TrimSpace(save["save"]) == "":
			log.LogAttrs(ctx, slog.LevelWarn,
				"zclaim: the Redis server persists nothing (no AOF, no RDB save points): a restart loses every job",
				slog.String("key", key))
		case err == nil:
			log.LogAttrs(ctx, slog.LevelWarn,
				"zclaim: the Redis server keeps RDB snapshots only: a crash rolls back to the last save, "+
					"so work finished since runs again and jobs scheduled since are lost (appendonly yes)",
				slog.String("key", key), slog.String("save", strings.TrimSpace(save["save"])))
		}
	}
	return nil
}

// startup is what NewBroker and NewIdempotency ask of the server: its
// eviction policy and persistence (checkServer), and the state marker.
func startup(rdb redis.UniversalClient, key string, allow bool, log *slog.Logger, state *stateMarker) error {
	ctx := context.Background()
	if err := checkServer(ctx, rdb, key, allow, true, log); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	state.check(sctx)
	return nil
}

// infoField returns the value of field in an INFO reply ("" if absent).
var infoField = redisinfo.Field

// stateMarker notices that the keys zclaim wrote were lost or rolled back.
// The marker key holds "<id> <seq>": a random id written at first use, and
// a sequence that every check advances by one (marker.lua). A process
// remembers the id and the sequence it last wrote; later, a marker that is
// missing or has another id means the server lost (or replaced) what it
// held, and one with the same id but a lower sequence means the server's
// state went back (restored from an older RDB snapshot or AOF, or a replica
// promoted without the last writes). The process then logs the loss once,
// counts it, and (for a rollback) marks a new id, so that every other
// process notices too. Checks run at most once per every, in the
// background (poll), and when a script's reply shows another marker.
type stateMarker struct {
	rdb   redis.UniversalClient
	key   string
	log   *slog.Logger
	what  string        // what was lost, for the log
	every time.Duration // how often poll checks

	checkMu sync.Mutex // one check at a time: a process's own advances are in order
	polled  atomic.Int64

	mu     sync.Mutex
	id     string    // the marker id this process knows; "" before the first read
	seq    int64     // the sequence this process last wrote: the server's must not be lower
	lostAt time.Time // when a loss was last noticed
	losses int64
	cur    string // current's answer, made when id or losses change
}

// newMarkerID returns a fresh marker id: random, with the time it was made.
func newMarkerID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:]) + "@" + time.Now().UTC().Format(time.RFC3339)
}

// poll has the marker checked in the background, at most once per every.
func (m *stateMarker) poll() {
	last := m.polled.Load()
	now := time.Now().UnixNano()
	if now-last < int64(m.every) || !m.polled.CompareAndSwap(last, now) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), max(m.every, time.Second))
		defer cancel()
		m.check(ctx)
	}()
}

// check reads and advances the marker (writing it at first use) and
// reports whether the state was lost or rolled back since the last check.
func (m *stateMarker) check(ctx context.Context) (lost bool, err error) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	m.mu.Lock()
	knownID, knownSeq := m.id, m.seq
	m.mu.Unlock()
	id, seq, err := m.advance(ctx, "")
	if err != nil {
		return false, err
	}
	rolledBack := knownID != "" && id == knownID && seq < knownSeq
	if rolledBack {
		// A new id, so that every other process notices too, however far
		// the sequence has come again meanwhile.
		if nid, nseq, err := m.advance(ctx, id); err == nil {
			id, seq = nid, nseq
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer func() {
		if m.cur = ""; m.id != "" {
			m.cur = m.id + "#" + strconv.FormatInt(m.losses, 10)
		}
	}()
	m.id, m.seq = id, seq+1
	if knownID == "" || id == knownID && !rolledBack {
		return false, nil // first use, or the state this process knows
	}
	m.lostAt = time.Now()
	m.losses++
	if rolledBack {
		m.log.LogAttrs(ctx, slog.LevelError, "zclaim: the Redis server's state went back: "+m.what+
			" are as they were earlier (restored from an older RDB snapshot, or a replica promoted "+
			"without the last writes); "+
			"work finished since may run again; claims and runs made before are void",
			slog.String("marker", m.key), slog.Int64("seen", knownSeq), slog.Int64("found", seq))
		return true, nil
	}
	m.log.LogAttrs(ctx, slog.LevelError, "zclaim: the Redis server lost "+m.what+
		" (it restarted without persistence, was flushed, or failed over to a replica that lacked them); claims "+
		"and runs made before are void",
		slog.String("marker", m.key))
	return true, nil
}

// advance runs marker.lua: it returns the marker's id and its sequence
// before this call. With replace (an id), a marker that still holds that
// id gets a new one.
func (m *stateMarker) advance(ctx context.Context, replace string) (string, int64, error) {
	raw, err := markerScript.Run(ctx, m.rdb, []string{m.key}, newMarkerID(), replace).Slice()
	if err != nil {
		return "", 0, err
	}
	if len(raw) != 2 {
		return "", 0, zerr("zclaim: state marker: %w: reply %v", ErrCorrupt, raw)
	}
	id, _ := raw[0].(string)
	seq, _ := raw[1].(int64)
	return id, seq, nil
}

// knows reports whether v, a marker value a script read, names the state
// this process knows.
func (m *stateMarker) knows(v string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, seq, _ := strings.Cut(v, " ")
	n, _ := strconv.ParseInt(seq, 10, 64)
	// A lower sequence than this process wrote: read before its own last
	// check wrote, or a rollback; a check tells which.
	return v != "" && id == m.id && n >= m.seq
}

// current names the state this process knows ("" before the first read):
// the marker's id and the losses noticed, so that it changes at each loss.
// Claims and runs carry it, to tell whether a loss came after them.
func (m *stateMarker) current() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur
}

// lost returns when a loss was last noticed (zero: never) and how many.
func (m *stateMarker) lost() (time.Time, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lostAt, m.losses
}

// replication is how many replicas a write must reach before it counts
// (WAIT), and for how long to wait for them.
type replication struct {
	n       int
	timeout time.Duration
}

// run runs script s as a write. With replicas to wait for, it sends the
// script and WAIT in one pipeline on the connection of the server that
// holds keys[0] (WAIT counts the writes of its own connection), and fails
// with ErrNotReplicated when fewer replicas acknowledge it in time: the
// write is then on the primary only, and a failover may lose it.
//
// A script refused because its slot is being migrated on Redis Cluster
// (TRYAGAIN: some of its keys have moved, some not; or CLUSTERDOWN while a
// failover completes) did not run: it is sent again after a backoff, for
// up to clusterRetryFor.
func (r replication) run(ctx context.Context, rdb redis.UniversalClient, s *redis.Script,
	keys []string, args ...any) *redis.Cmd {
	backoff := 5 * time.Millisecond
	deadline := time.Now().Add(clusterRetryFor)
	for {
		cmd := r.runOnce(ctx, rdb, s, keys, args...)
		if cc, ok := rdb.(*redis.ClusterClient); ok && r.n > 0 && cmd.Err() != nil {
			// With WAIT the script went to a node of the client's slot map,
			// on that node's own connection: a MOVED, an ASK or a node that
			// is gone say the map may be stale (reloads are rate-limited).
			cc.ReloadState(ctx)
		}
		if !retryable(cmd.Err()) || time.Now().After(deadline) || ctx.Err() != nil {
			return cmd
		}
		select {
		case <-ctx.Done():
			return cmd
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// clusterRetryFor bounds the retries of a script refused during a slot
// migration or a failover.
const clusterRetryFor = 5 * time.Second

// retryable reports an error of a script that Redis refused without
// running it, and that a moment later will run: a slot being migrated or
// a cluster that is failing over.
func retryable(err error) bool {
	if err == nil { // HasErrorPrefix allocates, even for nil
		return false
	}
	return redis.HasErrorPrefix(err, "TRYAGAIN") || redis.HasErrorPrefix(err, "CLUSTERDOWN") ||
		redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// isReplyErr reports whether err is an error reply of Redis' (to one
// command of a pipeline, say), not a failure to reach it.
func isReplyErr(err error) bool {
	var replyErr redis.Error
	return errors.As(err, &replyErr)
}

func (r replication) runOnce(ctx context.Context, rdb redis.UniversalClient, s *redis.Script,
	keys []string, args ...any) *redis.Cmd {
	if r.n <= 0 {
		return s.Run(ctx, rdb, keys, args...)
	}
	node, err := serverNode(ctx, rdb, keys[0])
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	for try := 0; ; try++ {
		var cmd *redis.Cmd
		var wait *redis.Cmd
		_, perr := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if try == 0 {
				cmd = s.EvalSha(ctx, p, keys, args...)
			} else {
				cmd = s.Eval(ctx, p, keys, args...)
			}
			wait = p.Do(ctx, "WAIT", r.n, max(1, r.timeout.Milliseconds()))
			return nil
		})
		switch {
		case try == 0 && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT"):
			continue
		case cmd.Err() != nil:
			return cmd
		case perr != nil:
			cmd.SetErr(perr)
		default:
			if got, err := wait.Int64(); err != nil {
				cmd.SetErr(err)
			} else if got < int64(r.n) {
				cmd.SetErr(fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, got, r.n, r.timeout))
			}
		}
		return cmd
	}
}

// validateReplication checks the WaitReplicas and WaitTimeout options.
func validateReplication(n int, timeout *time.Duration) error {
	switch {
	case n < 0:
		return fmt.Errorf("%w: WaitReplicas must be 0 or more, not %d", ErrInvalidOptions, n)
	case *timeout < 0:
		return fmt.Errorf("%w: WaitTimeout must not be negative, not %v", ErrInvalidOptions, *timeout)
	case n > 0 && *timeout == 0:
		*timeout = DefaultWaitTimeout
	}
	return nil
}

// DefaultWaitTimeout is how long a write waits for its replicas when
// WaitReplicas is set and WaitTimeout is zero.
const DefaultWaitTimeout = time.Second
