package zclaimvet

// Pairs: a read of due members and a later removal of the same key, sent
// apart, and the report of them.

import (
	"go/ast"
	"go/types"
	"slices"
	"strings"
)

// scoresRead reports a ZSCORE of key among evs: a read by rank whose
// members' scores are then compared in Go is a read of due members.
func scoresRead(evs []event, key string) bool {
	for _, e := range evs {
		if e.Score && e.Key == key {
			return true
		}
	}
	return false
}

// guarded reports an access after an atomic claim in the same function,
// or a removal after a gate: the claim or the gate decided who runs the
// job.
func guarded(evs []event, i int) bool {
	for j := range i {
		if evs[j].claim || gates(evs[j], evs[i]) {
			return true
		}
	}
	return false
}

// gates reports whether g, sent before removal rm, decides who sends rm:
// a removal of one member whose count is tested (a matchmaker's ZREM from
// its open set before the ZREM from its waiting list). Only the worker
// whose ZREM removed the member goes on, so what it removes after is
// cleanup, as after a claim.
func gates(g, rm event) bool {
	return byMember(g) && g.Checked && byMember(rm)
}

// pair reports, in the final pass, each read followed by a removal of the
// same key (the first such removal); it returns the events it paired.
// A claim between the read and the removal decided who runs the job: the
// removal cleans up, unreported. Before the read, a lock (SET NX) makes
// the poll correct while it is held, which gets a report of its own; any
// other claim there leaves the removal unreported, as cleanup after it.
// So does a read whose members body hands to nothing but the removal (a
// sweep of expired members, sweep): no job runs on them.
func (st *analysisState) pair(evs []event, body ast.Node) map[int]bool {
	paired := map[int]bool{}
	for i, rm := range evs {
		if rm.Read || rm.Score || rm.claim {
			continue
		}
		claimed, gated := -1, -1 // the last claim and gate before the removal
		for k := i - 1; k >= 0 && claimed < 0; k-- {
			if evs[k].claim {
				claimed = k
			}
		}
		for k := i - 1; k >= 0 && gated < 0; k-- {
			if gates(evs[k], rm) {
				gated = k
			}
		}
		for j := i - 1; j >= 0; j-- {
			r := evs[j]
			if !r.Read || r.claim || r.Key != rm.Key || r.Rank && !scoresRead(evs[j+1:i], r.Key) {
				continue
			}
			if r.group != nil && r.group == rm.group || gated > j {
				break // one MULTI/EXEC: atomic; or a gate between them
			}
			var lock *event
			if claimed >= 0 {
				if lock = lockBefore(evs[:j]); claimed > j || lock == nil {
					break
				}
			}
			paired[i], paired[j] = true, true
			if st.final && !st.sweep(r, rm, body) {
				st.report(r, rm, lock)
			}
			break
		}
		if rm.Async && !paired[i] {
			st.pairLater(evs, i, paired)
		}
	}
	return paired
}

// pairLater pairs removal evs[i], sent by a goroutine started before the
// read (a worker that removes what the poll loop after it hands over),
// with a later read of its key outside that goroutine. A claim before the
// removal in its goroutine makes it cleanup. Other claims before the read
// are judged as pair judges a claim before a read: a lock makes a poll
// under a lock, a pop alone no poll.
func (st *analysisState) pairLater(evs []event, i int, paired map[int]bool) {
	rm := evs[i]
	for k := i - 1; k >= 0; k-- {
		if (evs[k].claim || gates(evs[k], rm)) && evs[k].gor == rm.gor {
			return
		}
	}
	for j := i + 1; j < len(evs); j++ {
		r := evs[j]
		if !r.Read || r.claim || r.gor != nil && r.gor == rm.gor || r.Key != rm.Key || r.Rank && !scoresRead(evs[j+1:], r.Key) {
			continue
		}
		if r.group != nil && r.group == rm.group {
			return
		}
		var lock *event
		before := slices.DeleteFunc(slices.Clone(evs[:j]), func(e event) bool { return e.gor != nil && e.gor == rm.gor })
		if slices.ContainsFunc(before, func(e event) bool { return e.claim }) {
			if lock = lockBefore(before); lock == nil {
				return
			}
		}
		paired[i], paired[j] = true, true
		if st.final {
			st.report(r, rm, lock)
		}
		return
	}
}

// within reports whether node n lies inside node outer.
func within(n, outer ast.Node) bool {
	return n.Pos() >= outer.Pos() && n.End() <= outer.End()
}

// lockBefore returns the last lock taken among evs (a SET NX), or nil.
func lockBefore(evs []event) *event {
	for k := len(evs) - 1; k >= 0; k-- {
		if evs[k].claim && evs[k].Name != "" {
			return &evs[k]
		}
	}
	return nil
}

func (st *analysisState) report(r, rm event, lock *event) {
	for _, e := range []event{r, rm} {
		if e.callee != nil {
			if st.paired[e.callee] == nil {
				st.paired[e.callee] = map[int]bool{}
			}
			st.paired[e.callee][e.calleeI] = true
		}
	}
	if st.reported[r.node] || st.ok[line(st.pass, r.node)] || st.ok[line(st.pass, rm.node)] {
		return
	}
	st.reported[r.node] = true
	key := r.Shown
	if key == "" {
		key = display(r.Key)
	}
	at := rm.Pos
	switch {
	case rm.Checked:
		st.pass.Reportf(r.node.Pos(), CheckedMessage, at, r.Name, key)
	case lock != nil:
		st.pass.Reportf(r.node.Pos(), LockedMessage, r.Name, key, lock.Name, lock.Pos, rm.Name, at)
	default:
		st.pass.Reportf(r.node.Pos(), RacyMessage, r.Name, key, rm.Name, at)
	}
}

// pairFields reports what a type's methods leave unpaired: a read of a
// receiver's field key in one method and a removal of it in another (the
// batch handed on between them), unless a call site already paired them.
func (st *analysisState) pairFields() {
	type acc struct {
		fn   *types.Func
		i    int
		a    Access
		node ast.Node
	}
	byKey := map[string][]acc{}
	var keys []string
	for fn, s := range st.summaries {
		named := recvNamed(fn)
		if named == nil {
			continue
		}
		for i, a := range s.Accesses {
			if !strings.HasPrefix(a.Key, "⟨r⟩.") || st.paired[fn][i] || i >= len(st.origin[fn]) {
				continue
			}
			// An access that a method holds from another method of the
			// type it calls (Start calls poll) is that one's, already here.
			if call, ok := st.origin[fn][i].(*ast.CallExpr); ok {
				if c := calleeOf(st.pass, call); c != nil && c != fn && st.summaries[c] != nil && recvNamed(c) == named {
					continue
				}
			}
			k := named.Obj().Name() + " " + a.Key
			if byKey[k] == nil {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], acc{fn, i, a, st.origin[fn][i]})
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		list := byKey[k]
		slices.SortFunc(list, func(x, y acc) int { return int(x.node.Pos() - y.node.Pos()) })
		for _, r := range list {
			if !r.a.Read || r.a.Rank {
				continue
			}
			for _, rm := range list {
				if rm.a.Read || rm.a.Score || rm.fn == r.fn {
					continue
				}
				st.report(event{Access: r.a, node: r.node}, event{Access: rm.a, node: rm.node}, nil)
				break
			}
		}
	}
}

// recvNamed returns the named type of fn's receiver, or nil.
func recvNamed(fn *types.Func) *types.Named {
	recv := fn.Type().(*types.Signature).Recv()
	if recv == nil {
		return nil
	}
	t := types.Unalias(recv.Type())
	if p, ok := t.(*types.Pointer); ok {
		t = types.Unalias(p.Elem())
	}
	named, _ := t.(*types.Named)
	return named
}
