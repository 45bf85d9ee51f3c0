package zclaim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// What zclaim needs from the Redis server that holds its keys, checked
// when a Broker or an Idempotency store is made and again while it runs.

var (
	// ErrEvictionPolicy: the server may evict keys (a maxmemory-policy other
	// than noeviction), which loses jobs and run records in silence.
	ErrEvictionPolicy = errors.New("zclaim: the Redis server may evict keys")
	// ErrStateLost: the keys zclaim wrote are gone: the server restarted
	// without them, was flushed, or failed over to a replica that lacked
	// them. Claims and runs made before are void.
	ErrStateLost = errors.New("zclaim: the state in Redis was lost")
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
func checkServer(ctx context.Context, rdb redis.UniversalClient, key string, allow, startup bool, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, err := serverNode(ctx, rdb, key)
	var info string
	if err == nil {
		info, err = node.Info(ctx, "memory", "persistence").Result()
	}
	if err != nil {
		if startup {
			log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not read the server's eviction policy; checking again later",
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
			log.LogAttrs(ctx, slog.LevelWarn, "zclaim: the Redis server may evict keys; jobs or run records can vanish (AllowEviction is set)",
				slog.String("key", key), slog.String("maxmemory_policy", policy))
		}
	}
	if startup && infoField(info, "aof_enabled") == "0" {
		save, err := node.ConfigGet(ctx, "save").Result()
		if err == nil && strings.TrimSpace(save["save"]) == "" {
			log.LogAttrs(ctx, slog.LevelWarn, "zclaim: the Redis server persists nothing (no AOF, no RDB save points): a restart loses every job",
				slog.String("key", key))
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
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// stateMarker notices that the keys zclaim wrote were lost. It writes a
// marker key with a random value at first use and remembers the value;
// later, a marker that is missing or has another value means the server
// lost (or replaced) what it held. It then logs the loss once, counts it,
// and marks the new state so that the next loss is noticed too.
type stateMarker struct {
	rdb  redis.UniversalClient
	key  string
	log  *slog.Logger
	what string // what was lost, for the log

	mu     sync.Mutex
	value  string    // the marker this process knows; "" before the first read
	lostAt time.Time // when a loss was last noticed
	losses int64
}

// check reads the marker (writing it at first use) and reports whether the
// state was lost since the last check.
func (m *stateMarker) check(ctx context.Context) (lost bool, err error) {
	m.mu.Lock()
	known := m.value
	m.mu.Unlock()
	cur, err := m.rdb.Get(ctx, m.key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	if err == nil && cur == known {
		return false, nil
	}
	if err == nil && known == "" {
		m.mu.Lock()
		m.value = cur
		m.mu.Unlock()
		return false, nil
	}
	// Missing, or another process already marked a new state.
	if errors.Is(err, redis.Nil) {
		var b [8]byte
		rand.Read(b[:])
		mark := hex.EncodeToString(b[:]) + "@" + time.Now().UTC().Format(time.RFC3339)
		prev, err := m.rdb.SetArgs(ctx, m.key, mark, redis.SetArgs{Mode: "NX", Get: true}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			cur = mark
		case err != nil:
			return false, err
		default:
			cur = prev // another process marked it first
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.value == cur {
		return false, nil // another check of this process saw it first
	}
	prev := m.value
	m.value = cur
	if prev == "" {
		return false, nil // first use
	}
	m.lostAt = time.Now()
	m.losses++
	m.log.LogAttrs(ctx, slog.LevelError, "zclaim: the Redis server lost "+m.what+
		" (it restarted without persistence, was flushed, or failed over to a replica that lacked them); claims and runs made before are void",
		slog.String("marker", m.key))
	return true, nil
}

// current returns the marker value this process knows ("" if none yet).
func (m *stateMarker) current() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.value
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
func (r replication) run(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, keys []string, args ...any) *redis.Cmd {
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
	return redis.HasErrorPrefix(err, "TRYAGAIN") || redis.HasErrorPrefix(err, "CLUSTERDOWN") ||
		redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

func (r replication) runOnce(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, keys []string, args ...any) *redis.Cmd {
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
