package zclaimvet

// Pairs: a read of due members and a later removal of the same key, sent
// apart, and the report of them.

import (
	"fmt"
	"go/ast"
	"go/types"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/ast/astutil"
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
// job. A lock that the function lets go after the removal (rels) decided
// nothing.
func guarded(evs []event, i int, rels []release) bool {
	for j := range i {
		if evs[j].claim && releasedAt(evs[j], evs[i], rels) == nil || gates(evs[j], evs[i]) {
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
// sweep of expired members, sweep): no job runs on them. A lock on the
// member that body lets go (rels: after the removal, or deferred) is no
// claim: the pair gets a report of its own.
func (st *analysisState) pair(evs []event, body ast.Node, rels []release) map[int]bool {
	paired := map[int]bool{}
	for i, rm := range evs {
		if rm.Read || rm.Score || rm.claim || rm.MoveArg > 0 || rm.cleanup || rm.picked {
			// a ZADD of a parameter is its callers' to judge; a cleanup pairs
			// with nothing; nor does a removal of the member the caller picked
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
			if !r.Read || r.claim || r.Lookup || !sameKey(r.Key, rm.Key) ||
				r.Rank && !r.Head && !scoresRead(evs[j+1:i], r.Key) && !st.pushed(r, body) {
				continue
			}
			if r.group != nil && r.group == rm.group || gated > j {
				break // one MULTI/EXEC: atomic; or a gate between them
			}
			var lock *event
			var free *freed
			before := claimed
			if claimed > j {
				if free = releasedAll(evs[j+1:i], rm, rels); free == nil {
					break
				}
				before = slices.IndexFunc(evs[:j], func(e event) bool { return e.claim })
			}
			if before >= 0 {
				if lock = lockBefore(evs[:j]); lock == nil {
					break
				}
			}
			paired[i], paired[j] = true, true
			if st.final && !st.sweep(r, rm, body) {
				if lock == nil && before < 0 {
					lock = st.callerLock(body)
				}
				st.report(r, rm, lock, free)
			}
			break
		}
		if rm.Async && !paired[i] {
			st.pairLater(evs, i, paired, rels)
		}
	}
	return paired
}

// pushed reports a read by rank whose members body pushes on to a list or
// stream (pushOf): every member it read is handed to a worker, due or
// not, as a poll hands on what came due (a start that moves the whole set
// back to a work list).
func (st *analysisState) pushed(r event, body ast.Node) bool {
	return r.Rank && r.callee == nil && body != nil && st.pushOf(r, body) != nil
}

// pairLater pairs removal evs[i], sent by a goroutine started before the
// read (a worker that removes what the poll loop after it hands over),
// with a later read of its key outside that goroutine. A claim before the
// removal in its goroutine makes it cleanup, unless the goroutine lets
// it go after the removal (rels). Other claims before the read are judged
// as pair judges a claim before a read: a lock makes a poll under a lock,
// a pop alone no poll.
func (st *analysisState) pairLater(evs []event, i int, paired map[int]bool, rels []release) {
	rm := evs[i]
	var free *freed
	for k := i - 1; k >= 0; k-- {
		if evs[k].gor != rm.gor {
			continue
		}
		if evs[k].claim {
			if r := releasedAt(evs[k], rm, rels); r != nil {
				if free == nil {
					free = &freed{evs[k], r}
				}
				continue
			}
		}
		if evs[k].claim || gates(evs[k], rm) {
			return
		}
	}
	for j := i + 1; j < len(evs); j++ {
		r := evs[j]
		if !r.Read || r.claim || r.gor != nil && r.gor == rm.gor || !sameKey(r.Key, rm.Key) || r.Rank && !scoresRead(evs[j+1:], r.Key) {
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
			st.report(r, rm, lock, free)
		}
		return
	}
}

// callerLock returns the lock that every caller of the function of body
// takes before it calls it (a SET NX, a lock library's call or a lock
// helper's, earlier in the calling function: lockHeld), or nil: nil too
// when the function is called nowhere in the package, is used other than
// by a call, or may be called from another package (it is exported,
// outside a main package).
func (st *analysisState) callerLock(body ast.Node) *event {
	var fn *types.Func
	for f, fd := range st.decls {
		if fd.Body == body {
			fn = f
		}
	}
	if fn == nil || fn.Exported() && st.pass.Pkg.Name() != "main" {
		return nil
	}
	var lock *event
	for id, o := range st.pass.TypesInfo.Uses {
		if o != fn {
			continue
		}
		var l *event
		if call, outer := st.callSite(id); call != nil {
			l = st.lockHeld(call, outer)
		} else {
			l = st.helperLockFor(id) // a method value handed to a helper that locks, then calls it
		}
		if l == nil {
			return nil
		}
		if lock == nil || l.node.Pos() < lock.node.Pos() {
			lock = l
		}
	}
	return lock
}

// helperLockFor returns the lock a function value (id, as in
// "s.withLock(ctx, s.poll)") is called under: id is an argument of a call
// of a function of this package whose body calls that parameter where a
// lock it took is held (lockHeld), and nil otherwise.
func (st *analysisState) helperLockFor(id *ast.Ident) *event {
	for _, f := range st.pass.Files {
		if id.Pos() < f.Pos() || id.Pos() >= f.End() {
			continue
		}
		path, _ := astutil.PathEnclosingInterval(f, id.Pos(), id.End())
		arg := ast.Node(id)
		if len(path) > 1 {
			if sel, ok := path[1].(*ast.SelectorExpr); ok && sel.Sel == id {
				arg, path = sel, path[1:]
			}
		}
		if len(path) < 2 {
			return nil
		}
		call, ok := path[1].(*ast.CallExpr)
		if !ok {
			return nil
		}
		at := slices.IndexFunc(call.Args, func(a ast.Expr) bool { return ast.Unparen(a) == arg })
		helper := calleeOf(st.pass, call)
		if at < 0 || helper == nil || st.decls[helper] == nil {
			return nil
		}
		fd := st.decls[helper]
		var params []*ast.Ident
		for _, fl := range fd.Type.Params.List {
			params = append(params, fl.Names...)
		}
		if at >= len(params) {
			return nil
		}
		param := st.pass.TypesInfo.Defs[params[at]]
		var lock *event
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok && lock == nil {
				if fid, ok := ast.Unparen(c.Fun).(*ast.Ident); ok && param != nil && st.pass.TypesInfo.Uses[fid] == param {
					lock = st.lockHeld(c, fd.Body)
				}
			}
			return lock == nil
		})
		return lock
	}
	return nil
}

// lockHeld returns the lock held at call, taken earlier in outer, the
// body of the function that makes it: by a statement before the one
// that holds the call, in its block or a block around it (a lock taken
// in the init or condition of an if there whose body leaves, as in "if
// err := m.Lock(); err != nil { return err }", counts), or in the init
// or condition of an if whose body holds the call.
func (st *analysisState) lockHeld(call *ast.CallExpr, outer ast.Node) *event {
	var path []ast.Node
	for _, f := range st.pass.Files {
		if call.Pos() >= f.Pos() && call.Pos() < f.End() {
			path, _ = astutil.PathEnclosingInterval(f, call.Pos(), call.End())
		}
	}
	// lockIn returns the lock taken by a call among ns, outside function
	// literals and nested blocks.
	lockIn := func(ns ...ast.Node) *event {
		var l *event
		for _, n := range ns {
			if n == nil {
				continue
			}
			ast.Inspect(n, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.BlockStmt: // and a function literal's body
					return false
				case *ast.CallExpr:
					if name := st.lockOf(x); name != "" && l == nil {
						l = &event{node: x, claim: true, Access: Access{Name: name, Pos: pos(st.pass, x)}}
					}
				}
				return l == nil
			})
		}
		return l
	}
	for i := 1; i < len(path) && path[i-1] != outer; i++ {
		child := path[i-1]
		var before []ast.Stmt
		switch p := path[i].(type) {
		case *ast.BlockStmt:
			before = p.List
		case *ast.CommClause:
			before = p.Body
		case *ast.IfStmt:
			if child == p.Body {
				if l := lockIn(p.Init, p.Cond); l != nil {
					return l
				}
			}
		}
		for k := len(before) - 1; k >= 0; k-- {
			if before[k] == child {
				for _, b := range slices.Backward(before[:k]) {
					var l *event
					if ifs, ok := b.(*ast.IfStmt); ok {
						if ifs.Else == nil && exits(ifs.Body) {
							l = lockIn(ifs.Init, ifs.Cond)
						}
					} else {
						l = lockIn(b)
					}
					if l != nil {
						return l
					}
				}
			}
		}
	}
	return nil
}

// exits reports whether block b ends by leaving: a return or a branch
// (continue, break, goto).
func exits(b *ast.BlockStmt) bool {
	if len(b.List) == 0 {
		return false
	}
	switch b.List[len(b.List)-1].(type) {
	case *ast.ReturnStmt, *ast.BranchStmt:
		return true
	}
	return false
}

// callSite returns the call whose function is id and the body of the
// function (declared or literal) that makes it, or nil when id is used
// other than by a call.
func (st *analysisState) callSite(id *ast.Ident) (*ast.CallExpr, ast.Node) {
	for _, f := range st.pass.Files {
		if id.Pos() < f.Pos() || id.Pos() >= f.End() {
			continue
		}
		path, _ := astutil.PathEnclosingInterval(f, id.Pos(), id.End())
		var call *ast.CallExpr
		for i, n := range path[1:] {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if call == nil {
					if x.Sel != path[i] {
						return nil, nil
					}
					continue
				}
			case *ast.CallExpr:
				if call == nil && funOf(x) == path[i] {
					call = x
					continue
				}
			case *ast.FuncLit:
				if call != nil {
					return call, x.Body
				}
			case *ast.FuncDecl:
				if call != nil {
					return call, x.Body
				}
			}
			if call == nil {
				return nil, nil
			}
		}
	}
	return nil, nil
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

// freed is a claim of the member that the poller lets go after the
// removal (releasedAll).
type freed struct {
	claim event
	rel   *release
}

// releasedAll returns the last claim among evs, those between a read and
// removal rm, when rels let every one of them go after rm; else nil.
func releasedAll(evs []event, rm event, rels []release) *freed {
	var f *freed
	for _, e := range evs {
		if !e.claim {
			continue
		}
		r := releasedAt(e, rm, rels)
		if r == nil {
			return nil
		}
		f = &freed{e, r}
	}
	return f
}

func (st *analysisState) report(r, rm event, lock *event, free *freed) {
	for _, e := range []event{r, rm} {
		if e.callee != nil {
			if st.paired[e.callee] == nil {
				st.paired[e.callee] = map[int]bool{}
			}
			st.paired[e.callee][e.calleeI] = true
		}
	}
	if st.reported[r.node] {
		return
	}
	for _, n := range []ast.Node{r.node, rm.node} {
		if why, ok := st.ok[line(st.pass, n)]; ok {
			st.ignored[line(st.pass, n)] = why
			return
		}
	}
	st.reported[r.node] = true
	key := r.Shown
	if key == "" {
		key = display(r.Key)
	}
	at := rm.Pos
	them, it, verb, noun := "removes them", "removes it", "removes", "removal"
	if rm.Moves {
		them, it, verb, noun = "moves them to a later score", "moves it to a later score", "moves", "move"
	}
	switch {
	case rm.Checked:
		st.pass.Reportf(r.node.Pos(), CheckedMessage, at, r.Name, key)
	case lock != nil:
		st.pass.Reportf(r.node.Pos(), LockedMessage, r.Name, key, lock.Name, lock.Pos, rm.Name, at, them)
	case free != nil:
		st.pass.Reportf(r.node.Pos(), ReleasedMessage, r.Name, key, free.claim.Name, free.claim.Pos, rm.Name, at, it,
			free.rel.at, noun)
	default:
		st.pass.Report(analysis.Diagnostic{Pos: r.node.Pos(),
			Message:        fmt.Sprintf(RacyMessage, r.Name, key, rm.Name, at, them, verb),
			SuggestedFixes: st.claimHere(r.node, key, rm.Name, at)})
	}
}

// pairFields reports what a type's methods leave unpaired: a read of a
// receiver's field key in one method and a removal of it in another (the
// batch handed on between them), unless a call site already paired them,
// or the type takes the key's members in one script (scriptPolls).
// A read of one fixed score (Access.Fixed) is a lookup handed to the
// caller (the dead members), and a removal elsewhere its caller's ack: not
// paired; nor is a page of a listing (Access.Page), whose removal
// elsewhere is a user's action on one member. Nor is a removal by one
// score (Access.Exact): what it removes its caller names. Nor is one in a
// method that reads the key itself before it (a ZSCORE or a read:
// lookedUp), which pair judged where it stands: a user's move or kill of
// the one job they picked looks it up first.
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
			if !r.a.Read || r.a.Rank || r.a.Fixed || r.a.Page || r.a.Lookup || st.scriptPolls(recvNamed(r.fn))[r.a.Key] {
				continue
			}
			for _, rm := range list {
				if rm.a.Read || rm.a.Score || rm.a.MoveArg > 0 || rm.fn == r.fn || rm.a.Exact ||
					lookedUp(st.summaries[rm.fn].Accesses[:rm.i], rm.a.Key) {
					continue
				}
				st.report(event{Access: r.a, node: r.node}, event{Access: rm.a, node: rm.node}, nil, nil)
				break
			}
		}
	}
}

// lookedUp reports a ZSCORE or a read of key among accesses.
func lookedUp(accesses []Access, key string) bool {
	return slices.ContainsFunc(accesses, func(a Access) bool { return (a.Score || a.Read) && a.Key == key })
}

// scriptPolls returns the keys that a method of type named hands to a
// Lua script which takes members of them itself (its source reads the
// key and removes or pops from it: luaTakes; a script whose source is not
// in the code counts too). Such a type claims in one script: its poll is
// there, and a read of the key in another method is a peek or a listing
// whose members it hands to no removal of its own.
func (st *analysisState) scriptPolls(named *types.Named) map[string]bool {
	if keys, ok := st.polls[named]; ok {
		return keys
	}
	keys := map[string]bool{}
	for fn, fd := range st.decls {
		if recvNamed(fn) != named {
			continue
		}
		sc := st.scope(fd)
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			args, ok := st.scriptCall(sc, call)
			if !ok {
				return true
			}
			src, known := st.scriptSource(sc, call)
			for i, k := range args.elts {
				if !known || luaTakes(src, i) {
					keys[st.norm(sc, k, 0)] = true
				}
			}
			return true
		})
	}
	st.polls[named] = keys
	return keys
}

// luaTakes reports whether script src both reads the sorted set that is
// its key i (from 0) and removes or pops members of it.
func luaTakes(src string, i int) bool {
	aliases := map[string]bool{"KEYS[" + strconv.Itoa(i+1) + "]": true}
	for _, m := range luaAlias.FindAllStringSubmatch(src, -1) {
		if m[2] == strconv.Itoa(i+1) {
			aliases[m[1]] = true
		}
	}
	read, taken := false, false
	for _, m := range luaCall.FindAllStringSubmatch(src, -1) {
		cmd := strings.ToUpper(m[1])
		if !aliases[m[2]] {
			continue
		}
		read = read || luaReads[cmd]
		taken = taken || cmd == "ZREM" || cmd == "ZPOPMIN" || cmd == "ZPOPMAX" || cmd == "ZREMRANGEBYSCORE"
	}
	return read && taken
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
