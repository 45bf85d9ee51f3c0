package zclaimvet

// Calls: what a function leaves to its callers (its summary) and what a
// call of another function, or of the project's own client wrapper, sends.

import (
	"go/ast"
	"go/types"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// summarize collects the events of fd, pairs them (reporting in the final
// pass), and returns what it leaves to its callers.
func (st *analysisState) summarize(fd *ast.FuncDecl) *Summary {
	s := st.scope(fd)
	evs := st.markCleanups(s, st.events(s, fd.Body, nil))
	rels := st.releases(s, fd.Body)
	pairedIdx := st.pair(evs, fd.Body, rels)
	fn, _ := st.pass.TypesInfo.Defs[fd.Name].(*types.Func)
	if st.final && fn != nil {
		st.handOffs(fn, evs, fd.Body, pairedIdx)
	}
	// Each function literal (but those run in a pipeline, part of fd, and
	// those of a WATCH transaction) is a poller of its own.
	inline := map[*ast.FuncLit]bool{}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			if lit, _ := pipelined(st.pass, x); lit != nil {
				inline[lit] = true
			}
			for _, lit := range st.inPlaceLiterals(x) {
				inline[lit] = true
			}

		case *ast.FuncLit:
			if !inline[x] && !st.watched[x.Body] {
				st.pair(st.markCleanups(s, st.events(s, x.Body, nil)), x.Body, st.releases(s, x.Body))
			}
		}
		return true
	})
	// A key both read and removed in one MULTI/EXEC is claimed atomically
	// there: its accesses are no caller's to pair.
	atomic := map[[2]any]int{}
	for _, ev := range evs {
		if ev.group != nil && !ev.claim && !ev.echo {
			k := [2]any{ev.group, ev.Key}
			if ev.Read {
				atomic[k] |= 1
			} else {
				atomic[k] |= 2
			}
		}
	}
	out := &Summary{}
	var nodes []ast.Node
	for i, ev := range evs {
		if ev.claim || ev.echo || pairedIdx[i] || local(ev.Key) || guarded(evs, i, rels) || ev.cleanup ||
			ev.group != nil && atomic[[2]any{ev.group, ev.Key}] == 3 {
			continue
		}
		if ev.Checked && !ev.Read && !ev.Forward && ev.callee == nil {
			ev.Access.Guards = st.ownGuard(s, fd, ev.node)
		}
		out.Accesses = append(out.Accesses, ev.Access)
		nodes = append(nodes, ev.node)
	}
	if fn != nil && st.final {
		st.origin[fn] = nodes
	}
	out.Sends = st.sends(s, fd)
	out.Lock = lockHelper(fd.Name.Name, evs)
	out.Unlock = isUnlock(fd.Name.Name, rels, st.sendsScript(fd.Body))
	out.Runs = st.runs(s, fd)
	return out
}

// lockHelper returns the lock a function named name takes, whose events
// are evs, when it is a lock helper: named for taking a lock (TryLock,
// acquireLock, lockJob, Acquire; not unlock) and sending nothing but the
// lock and other claims. Calling it takes that lock.
func lockHelper(name string, evs []event) string {
	n := strings.ToLower(name)
	if !strings.Contains(n, "lock") && !strings.HasPrefix(n, "acquire") || strings.Contains(n, "unlock") {
		return ""
	}
	lock := ""
	for _, ev := range evs {
		if !ev.claim {
			return ""
		}
		if lock == "" {
			lock = ev.Name
		}
	}
	return lock
}

// lockOf returns the name of the lock call takes: a SET NX, a lock
// library's, or a lock helper's (helperLock), or "".
func (st *analysisState) lockOf(call *ast.CallExpr) string {
	if _, lock := claimOf(st.pass, call); lock != "" {
		return lock
	}
	return st.helperLock(call)
}

// helperLock returns the name of the lock a call of a lock helper takes
// (its summary's Lock, shown as "SET NX (in TryLock)"), or "".
func (st *analysisState) helperLock(call *ast.CallExpr) string {
	if fn := calleeOf(st.pass, call); fn != nil {
		if sum := st.summaryOf(fn); sum != nil && sum.Lock != "" {
			return sum.Lock + " (in " + fn.Name() + ")"
		}
	}
	return ""
}

// sends recognizes a wrapper that sends the command it is given with the
// arguments it is given: a redigo Do or Send, or a call of another such
// wrapper, of a parameter and the variadic parameter spread.
func (st *analysisState) sends(s *fnScope, fd *ast.FuncDecl) *Sends {
	pass := st.pass
	var out *Sends
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || out != nil || !call.Ellipsis.IsValid() || len(call.Args) != 2 {
			return out == nil
		}
		cmdAt, argsAt := -1, -1
		if id, ok := ast.Unparen(call.Args[0]).(*ast.Ident); ok {
			if i, ok := s.params[pass.TypesInfo.ObjectOf(id)]; ok {
				cmdAt = i
			}
		}
		if id, ok := ast.Unparen(call.Args[1]).(*ast.Ident); ok {
			if i, ok := s.params[pass.TypesInfo.ObjectOf(id)]; ok {
				argsAt = i
			}
		}
		if cmdAt < 0 || argsAt < 0 {
			return true
		}
		if isRedigoSend(pass, call) || st.sendsOf(call) != nil {
			out = &Sends{Cmd: cmdAt, Args: argsAt}
		}
		return out == nil
	})
	return out
}

// summaryOf returns fn's summary: this package's, a fact of another's, or
// for a method of an interface (the project's own client interface), that
// of the method of the same name and signature of a type of the
// interface's package or, failing that, of a package it imports (a small
// interface a package declares over the client wrapper it uses).
func (st *analysisState) summaryOf(fn *types.Func) *Summary {
	if s := st.summaries[fn]; s != nil {
		return s
	}
	if s := new(Summary); st.pass.ImportObjectFact(fn, s) {
		return s
	}
	sig, _ := fn.Type().(*types.Signature)
	if sig == nil || sig.Recv() == nil || !types.IsInterface(sig.Recv().Type()) || fn.Pkg() == nil {
		return nil
	}
	// This package's summaries grow over the rounds of run; other
	// packages' facts do not, so what is found there is kept.
	pkgs := fn.Pkg().Imports()
	if fn.Pkg() == st.pass.Pkg {
		if s := st.implSummary(fn, sig, fn.Pkg()); s != nil {
			return s
		}
	} else {
		pkgs = append([]*types.Package{fn.Pkg()}, pkgs...)
	}
	if s, ok := st.impls[fn]; ok {
		return s
	}
	var s *Summary
	for _, p := range pkgs {
		if s = st.implSummary(fn, sig, p); s != nil {
			break
		}
	}
	st.impls[fn] = s
	return s
}

// mayHold reports whether package p may hold a summary: it is this one, or
// it uses a Redis client (its Uses fact).
func (st *analysisState) mayHold(p *types.Package) bool {
	return p == st.pass.Pkg || st.pass.ImportPackageFact(p, new(Uses))
}

// implSummary returns the summary of the method of a type of pkg that
// has interface method fn's name and signature sig, or nil.
func (st *analysisState) implSummary(fn *types.Func, sig *types.Signature, pkg *types.Package) *Summary {
	if !st.mayHold(pkg) {
		return nil
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		tn, ok := scope.Lookup(name).(*types.TypeName)
		if !ok || types.IsInterface(tn.Type()) {
			continue
		}
		obj, _, _ := types.LookupFieldOrMethod(types.NewPointer(tn.Type()), true, pkg, fn.Name())
		m, ok := obj.(*types.Func)
		if !ok || m == fn {
			continue
		}
		ms, _ := m.Type().(*types.Signature)
		if ms == nil || !types.Identical(types.NewSignatureType(nil, nil, nil, ms.Params(), ms.Results(), ms.Variadic()),
			types.NewSignatureType(nil, nil, nil, sig.Params(), sig.Results(), sig.Variadic())) {
			continue
		}
		if s := st.summaries[m]; s != nil {
			return s
		}
		if s := new(Summary); st.pass.ImportObjectFact(m, s) {
			return s
		}
	}
	return nil
}

// sendsOf returns the Sends of the wrapper call calls, nil if none.
func (st *analysisState) sendsOf(call *ast.CallExpr) *Sends {
	fn := calleeOf(st.pass, call)
	if fn == nil {
		return nil
	}
	if sum := st.summaries[fn]; sum != nil {
		return sum.Sends
	}
	sum := new(Summary)
	if st.pass.ImportObjectFact(fn, sum) {
		return sum.Sends
	}
	return nil
}

func calleeOf(pass *analysis.Pass, call *ast.CallExpr) *types.Func {
	switch f := funOf(call).(type) {
	case *ast.Ident:
		fn, _ := pass.TypesInfo.Uses[f].(*types.Func)
		return fn
	case *ast.SelectorExpr:
		fn, _ := pass.TypesInfo.Uses[f.Sel].(*types.Func)
		return fn
	}
	return nil
}

// funOf returns the function call calls, without its type arguments
// (Due[string](...)).
func funOf(call *ast.CallExpr) ast.Expr {
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.IndexExpr:
		return ast.Unparen(f.X)
	case *ast.IndexListExpr:
		return ast.Unparen(f.X)
	default:
		return f
	}
}

// viaSends reads a command sent through a wrapper: Do("ZREM", key, id),
// or Do("ZREM", args...) with args the caller's own variadic parameter,
// whose first element is then the key.
func (st *analysisState) viaSends(s *fnScope, call *ast.CallExpr, w *Sends) (event, bool) {
	pass := st.pass
	if w.Cmd >= len(call.Args) || w.Args > len(call.Args) {
		return event{}, false
	}
	if len(st.constStrings(s, call.Args[w.Cmd])) == 0 {
		return event{}, false
	}
	rest := call.Args[w.Args:]
	if call.Ellipsis.IsValid() && len(rest) == 1 {
		id, ok := ast.Unparen(rest[0]).(*ast.Ident)
		if !ok {
			return event{}, false
		}
		k, ok := s.params[pass.TypesInfo.ObjectOf(id)]
		if !ok {
			return event{}, false
		}
		// The key is the first of the caller's own arguments.
		lit := &ast.CallExpr{Fun: call.Fun, Args: []ast.Expr{call.Args[w.Cmd]}}
		ev, ok := st.doCommand(s, lit, []ast.Expr{call.Args[w.Cmd], call.Args[w.Cmd]})
		if !ok {
			return event{}, false
		}
		ev.node, ev.Pos = call, pos(pass, call)
		ev.Key, ev.Shown = "⟨p"+strconv.Itoa(k)+"[0]⟩", id.Name+"[0]"
		if !ev.Read {
			ev.Forward, ev.Batch, ev.Checked = true, false, false
		}
		return ev, true
	}
	ev, ok := st.doCommand(s, call, append([]ast.Expr{call.Args[w.Cmd]}, rest...))
	ev.node = call
	return ev, ok
}

// viaCallee translates the accesses of a function the call calls (its
// summary) into this function's terms.
func (st *analysisState) viaCallee(s *fnScope, call *ast.CallExpr, group any) []event {
	pass := st.pass
	var fn *types.Func
	var recv ast.Expr
	switch f := funOf(call).(type) {
	case *ast.Ident:
		fn, _ = pass.TypesInfo.Uses[f].(*types.Func)
	case *ast.SelectorExpr:
		fn, _ = pass.TypesInfo.Uses[f.Sel].(*types.Func)
		if sel := pass.TypesInfo.Selections[f]; sel != nil {
			recv = f.X
		}
	}
	if fn == nil {
		return nil
	}
	sum := st.summaryOf(fn)
	if sum == nil {
		return nil
	}
	args := make([]string, len(call.Args))
	for i, a := range call.Args {
		args[i] = st.norm(s, a, 0)
		if i == len(call.Args)-1 && call.Ellipsis.IsValid() {
			if strings.HasPrefix(args[i], "⟨p") {
				args[i] += "..." // first of it: the caller's own first
			} else {
				args[i] = "⟨? spread " + strconv.Itoa(int(a.Pos())) + "⟩"
			}
		}
	}
	r := "⟨? " + strconv.Itoa(int(call.Pos())) + "⟩"
	if recv != nil {
		r = st.norm(s, recv, 0)
	}
	var evs []event
	for i, a := range sum.Accesses {
		key, ok := substitute(a.Key, args, r)
		if !ok {
			continue
		}
		ev := event{Access: a, node: call, group: group, callee: fn, calleeI: i}
		if a.MoveArg > 0 {
			// A ZADD of a parameter: a move of what this caller read, or
			// of its own parameter (its callers' to tell), or nothing.
			if a.MoveArg > len(call.Args) {
				continue
			}
			read, param := st.readMember(s, call.Args[a.MoveArg-1:a.MoveArg])
			if !read && param == 0 {
				continue
			}
			ev.MoveArg = param // 0 where the member is one this caller read
		}
		if a.Lookup && a.LookupArg > 0 {
			// A lookup of the score its caller names: the clock's time
			// makes it a read of what came due; a parameter of this
			// function passes the question on.
			ev.LookupArg = 0
			if a.LookupArg <= len(call.Args) {
				arg := call.Args[a.LookupArg-1]
				ev.Lookup = !st.fromClock(s, arg, 0)
				if ev.Lookup {
					ev.LookupArg = st.paramOf(s, arg, 0)
				}
			}
		}
		if a.Async {
			ev.gor = call // the callee's goroutines: their order is the callee's to pair
		}
		ev.Key = key
		ev.Pos = pos(pass, call)
		if !strings.Contains(ev.Name, " (in ") {
			ev.Name += " (in " + fn.Name() + ")"
		}
		if i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(a.Key, "⟨p"), "⟩"), "[0]")); err == nil &&
			i < len(call.Args) {
			ev.Shown = render(pass, call.Args[i])
		} else if strings.HasPrefix(a.Key, "⟨r⟩.") && recv != nil {
			ev.Shown = render(pass, recv) + strings.TrimPrefix(a.Key, "⟨r⟩")
		}
		if !a.Read && !a.Score && !a.Forward && a.Checked {
			// The callee tests the count and returns the outcome: a check
			// only where this caller tests it in turn, or where the
			// callee's test guards the work it does itself.
			ev.Checked = a.Guards || st.countTested(s, call)
		}
		if !a.Read && a.Forward {
			sig := fn.Type().(*types.Signature)
			n := len(call.Args) - (sig.Params().Len() - 1)
			if strings.HasSuffix(a.Key, "[0]⟩") {
				n-- // the first is the key
			}
			single := n == 1 && !call.Ellipsis.IsValid() && !isSlice(pass, call.Args[len(call.Args)-1])
			ev.Batch = !single
			ev.Checked = single && st.countTested(s, call)
		}
		evs = append(evs, ev)
	}
	return evs
}
