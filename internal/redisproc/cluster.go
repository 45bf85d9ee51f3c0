package redisproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/proc"
)

// Cluster is a local Redis Cluster: masters and their replicas, each a
// redis-server of its own, joined with redis-cli --cluster create.
type Cluster struct {
	Nodes []*Server // masters first, as created; roles change on failover
}

// StartCluster starts masters × (1 + replicas) servers with
// --cluster-enabled yes and args, joins them with `redis-cli --cluster
// create ... --cluster-replicas replicas --cluster-yes` (the masters get
// equal, contiguous slot ranges; a single master takes every slot with
// CLUSTER ADDSLOTSRANGE) and waits until every node says
// cluster_state:ok and every replica is linked. A node that fails is
// noticed after 1 s (cluster-node-timeout), so a replica takes over a
// killed master within seconds; a master syncs a replica at once
// (repl-diskless-sync-delay 0), not after Redis' default 5 s wait for
// more replicas, when the cluster starts and when a node comes back.
func StartCluster(masters, replicas int, args ...string) (*Cluster, error) {
	cli, err := redisCLI()
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for range masters * (1 + replicas) {
		s, err := Start(append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-allow-replica-migration", "no",
			"--repl-diskless-sync-delay", "0"}, args...)...)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	if masters == 1 && replicas == 0 {
		// redis-cli joins three masters or more: one takes every slot itself.
		n := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr})
		err := n.Do(context.Background(), "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err()
		n.Close()
		if err == nil {
			err = c.WaitOK(20 * time.Second)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	cmdArgs := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		cmdArgs = append(cmdArgs, s.Addr)
	}
	cmdArgs = append(cmdArgs, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.Command(cli, cmdArgs...)
	proc.DieWithParent(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, lastLines(out))
	}
	if err := c.WaitOK(20 * time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// redisCLI finds redis-cli beside the redis-server on PATH, else on PATH.
func redisCLI() (string, error) {
	if srv, err := exec.LookPath("redis-server"); err == nil {
		if p := filepath.Join(filepath.Dir(srv), "redis-cli"); fileExists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", fmt.Errorf("redis-cli is not on PATH (a Redis Cluster is joined with it)")
	}
	return p, nil
}

// WaitOK waits until every running node says cluster_state:ok, agrees on
// the masters of all slots, and every replica is linked to its master.
func (c *Cluster) WaitOK(d time.Duration) error {
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		if last = c.check(); last == "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the cluster is not ok after %v: %s", d, last)
}

// check returns what is not ok yet ("" when all is).
func (c *Cluster) check() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var view string
	for _, s := range c.running() {
		n := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		info, err := n.ClusterInfo(ctx).Result()
		var slots []redis.ClusterSlot
		if err == nil {
			slots, err = n.ClusterSlots(ctx).Result()
		}
		var repl string
		if err == nil {
			repl, err = n.Info(ctx, "replication").Result()
		}
		n.Close()
		switch {
		case err != nil:
			return s.Addr + ": " + err.Error()
		case !strings.Contains(info, "cluster_state:ok"):
			return s.Addr + ": cluster_state not ok"
		case strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up"):
			return s.Addr + ": replica not linked"
		}
		v := slotView(slots)
		if view == "" {
			view = v
		} else if v != view {
			return "nodes disagree on the slots' masters"
		}
	}
	return ""
}

func slotView(slots []redis.ClusterSlot) string {
	var b strings.Builder
	for _, s := range slots {
		if len(s.Nodes) > 0 {
			fmt.Fprintf(&b, "%d-%d:%s ", s.Start, s.End, s.Nodes[0].Addr)
		}
	}
	return b.String()
}

func (c *Cluster) running() []*Server {
	var out []*Server
	for _, s := range c.Nodes {
		s.mu.Lock()
		up := s.cmd != nil
		s.mu.Unlock()
		if up {
			out = append(out, s)
		}
	}
	return out
}

// Addrs returns the addresses of every node, for a cluster client.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, s := range c.Nodes {
		out = append(out, s.Addr)
	}
	return out
}

// Client returns a cluster client of the nodes that are running.
func (c *Cluster) Client() *redis.ClusterClient {
	var addrs []string
	for _, s := range c.running() {
		addrs = append(addrs, s.Addr)
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
}

// Masters returns the servers that are masters now, by the slots they serve.
func (c *Cluster) Masters() []*Server {
	var out []*Server
	for _, s := range c.running() {
		if c.role(s) == "master" {
			out = append(out, s)
		}
	}
	return out
}

// Node returns the server at addr.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

func (c *Cluster) role(s *Server) string {
	n := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer n.Close()
	info, _ := n.Info(context.Background(), "replication").Result()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return v
		}
	}
	return ""
}

// MasterOf returns the master that serves slot now.
func (c *Cluster) MasterOf(slot int) (*Server, error) {
	for _, s := range c.running() {
		n := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		slots, err := n.ClusterSlots(context.Background()).Result()
		n.Close()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
				return c.Node(r.Nodes[0].Addr), nil
			}
		}
	}
	return nil, fmt.Errorf("no master serves slot %d", slot)
}

// ReplicaOf returns a running replica of master.
func (c *Cluster) ReplicaOf(master *Server) (*Server, error) {
	m := redis.NewClient(&redis.Options{Addr: master.Addr, MaxRetries: -1})
	defer m.Close()
	id, err := m.ClusterMyID(context.Background()).Result()
	if err != nil {
		return nil, err
	}
	for _, s := range c.running() {
		n := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		nodes, _ := n.ClusterNodes(context.Background()).Result()
		myID, _ := n.ClusterMyID(context.Background()).Result()
		n.Close()
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && f[0] == myID && strings.Contains(f[2], "slave") && f[3] == id {
				return s, nil
			}
		}
	}
	return nil, fmt.Errorf("no running replica of %s", master.Addr)
}

// MoveSlot migrates slot from its master to the master to, the way
// redis-cli --cluster reshard does it: IMPORTING on the target, MIGRATING
// on the source, MIGRATE of its keys in batches of batch (pausing pause
// after each, so that clients meet ASK and TRYAGAIN meanwhile), then
// SETSLOT NODE on every master.
func (c *Cluster) MoveSlot(slot int, to *Server, batch int, pause time.Duration) error {
	ctx := context.Background()
	from, err := c.MasterOf(slot)
	if err != nil {
		return err
	}
	if from == to {
		return nil
	}
	src := redis.NewClient(&redis.Options{Addr: from.Addr, MaxRetries: -1})
	defer src.Close()
	dst := redis.NewClient(&redis.Options{Addr: to.Addr, MaxRetries: -1})
	defer dst.Close()
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	dstID, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return fmt.Errorf("SETSLOT IMPORTING: %w", err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return fmt.Errorf("SETSLOT MIGRATING: %w", err)
	}
	host, port := to.Addr[:strings.LastIndexByte(to.Addr, ':')], to.Port
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, batch).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE: %w", err)
		}
		time.Sleep(pause)
	}
	for _, s := range append([]*Server{to, from}, c.Masters()...) {
		n := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		n.Close()
		if err != nil && s != from && s != to {
			return fmt.Errorf("SETSLOT NODE on %s: %w", s.Addr, err)
		}
	}
	return c.WaitOK(10 * time.Second)
}

// Close stops every node and removes its folder.
func (c *Cluster) Close() {
	for _, s := range c.Nodes {
		s.Close()
	}
}

func lastLines(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-3):], " / ")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
