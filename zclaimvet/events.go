package zclaimvet

// Events: the sorted-set accesses and claims a function body sends, in
// source order, through its closures, pipelines, transactions and
// goroutines.

import (
	"go/ast"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// events returns the accesses body sends, in source order: its own
// commands, those of the functions it calls (from their summaries), those
// of the closures it hands to Pipelined (inline) and TxPipelined (one
// group), and those of the goroutines it starts (go statements, runners:
// marked Async); not those of other function literals or of WATCH
// transactions.
func (st *analysisState) events(s *fnScope, body *ast.BlockStmt, group any) []event {
	pass := st.pass
	var evs []event
	var multi any // a redigo MULTI in progress
	watches := false
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ForStmt, *ast.RangeStmt:
			// A loop runs its body again: the members it removes before
			// it reads (a ZREM of the batch read last time) it removes
			// after the read of the iteration before. Where such a
			// removal comes first, the loop's events are followed by an
			// echo of them, a second iteration for pair alone; not of its
			// removals by range, which trim what the next read leaves.
			once, again := loopParts(x)
			for _, c := range once {
				ast.Inspect(c, visit)
			}
			start := len(evs)
			for _, c := range again {
				ast.Inspect(c, visit)
			}
			if removesBeforeRead(evs[start:]) {
				// The second iteration's transactions are others than
				// the first's.
				groups := map[any]any{}
				for _, e := range slices.Clone(evs[start:]) {
					if e.Read || e.claim || e.Score || byMember(e) {
						if e.group != nil {
							if groups[e.group] == nil {
								groups[e.group] = &echoGroup{e.group}
							}
							e.group = groups[e.group]
						}
						e.echo = true
						evs = append(evs, e)
					}
				}
			}
			return false
		case *ast.CompositeLit, *ast.ReturnStmt:
			// A literal kept in a value or returned (a message's
			// callback that acknowledges it, say) runs when its holder
			// calls it: after what this function sent before it.
			for _, lit := range keptLiterals(x) {
				if !st.watched[lit.Body] { // a WATCH transaction's function: atomic where it runs
					evs = append(evs, st.events(s, lit.Body, group)...)
				}
			}
			return true
		case *ast.GoStmt:
			// A goroutine runs beside what follows it.
			start := len(evs)
			ast.Inspect(x.Call, visit)
			onGoroutine(evs[start:], x)
			return false
		case *ast.CallExpr:
			if isWatch(pass, x) {
				return false
			}
			if cmd, ok := namedCmd(pass, x); ok {
				switch cmd {
				case "WATCH":
					watches = true
				case "MULTI":
					multi = x
				case "EXEC", "DISCARD":
					multi = nil
				}
			}
			// A literal handed to a runner (errgroup's and WaitGroup's
			// Go, a pool's Submit, time.AfterFunc) runs beside what
			// follows, as a goroutine does.
			if lits := runLiterals(x); lits != nil {
				for _, lit := range lits {
					start := len(evs)
					evs = append(evs, st.events(s, lit.Body, group)...)
					onGoroutine(evs[start:], lit)
				}
				return false
			}
			// A literal handed to a function that runs it before it
			// returns (inPlaceLiterals) runs as part of this function.
			if lits := st.inPlaceLiterals(x); lits != nil {
				for _, lit := range lits {
					evs = append(evs, st.events(s, lit.Body, group)...)
				}
				return false
			}
			// A literal called where it stands (go func(){...}(),
			// defer func(){...}()) runs as part of this function.
			if lit, ok := ast.Unparen(x.Fun).(*ast.FuncLit); ok {
				evs = append(evs, st.events(s, lit.Body, group)...)
				return false
			}
			if lit, tx := pipelined(pass, x); lit != nil {
				g := group
				if tx {
					g = lit
				}
				evs = append(evs, st.events(s, lit.Body, g)...)
				return false
			}
			g := group
			if multi != nil {
				g = multi
			}
			if txg := st.txPipe(s, x); txg != nil {
				g = txg
			}
			if revs, watch, ok := st.rueidisEvents(s, x, g); ok {
				watches = watches || watch
				for _, ev := range revs {
					if !ev.Read || !st.discarded[x] {
						evs = append(evs, ev)
					}
				}
				return true
			}
			if ev, ok := st.classify(s, x); ok {
				if ev.Read && st.discarded[x] {
					return true // no members read: nothing polled
				}
				ev.group = g
				evs = append(evs, ev)
				return true
			}
			if w := st.sendsOf(x); w != nil {
				if ev, ok := st.viaSends(s, x, w); ok {
					ev.group = g
					evs = append(evs, ev)
				}
				return true
			}
			if claim, lock := claimOf(pass, x); claim || st.addClaim(s, x) {
				evs = append(evs, event{node: x, claim: true, Access: Access{Name: lock, Key: st.claimKey(s, x), Pos: pos(pass, x)}})
				return true
			}
			if lock := st.helperLock(x); lock != "" {
				evs = append(evs, event{node: x, claim: true, Access: Access{Name: lock, Pos: pos(pass, x)}})
			}
			if ev, ok := st.scriptRemoval(s, x); ok {
				ev.group = g
				evs = append(evs, ev)
				return true
			}
			evs = append(evs, st.viaCallee(s, x, g)...)
		}
		return true
	}
	ast.Inspect(body, visit)
	if watches {
		return nil
	}
	return evs
}

// echoGroup is a MULTI/EXEC group of a loop's second iteration (events).
type echoGroup struct{ of any }

// loopParts returns the parts of loop x that run once, before it, and
// those that run at each iteration.
func loopParts(x ast.Node) (once, again []ast.Node) {
	add := func(list []ast.Node, ns ...ast.Node) []ast.Node {
		for _, n := range ns {
			if n != nil {
				list = append(list, n)
			}
		}
		return list
	}
	switch l := x.(type) {
	case *ast.ForStmt:
		return add(nil, l.Init), add(nil, l.Cond, l.Body, l.Post)
	case *ast.RangeStmt:
		return add(nil, l.X), add(nil, l.Body)
	}
	return nil, nil
}

// byMember reports a removal of members named (ZREM), not by range.
func byMember(e event) bool {
	return !e.Read && !e.Score && !e.claim && !strings.HasPrefix(e.Name, "ZREMRANGE") && e.MoveArg == 0
}

// removesBeforeRead reports a removal of members among evs followed by a
// read of its key.
func removesBeforeRead(evs []event) bool {
	for i, rm := range evs {
		if !byMember(rm) {
			continue
		}
		for _, r := range evs[i+1:] {
			if r.Read && !r.claim && r.Key == rm.Key {
				return true
			}
		}
	}
	return false
}

// onGoroutine marks evs as sent by goroutine g of the function (those of
// a goroutine g starts in turn keep theirs).
func onGoroutine(evs []event, g ast.Node) {
	for k := range evs {
		evs[k].Async = true
		if evs[k].gor == nil {
			evs[k].gor = g
		}
	}
}

// pipelined returns the function literal of a go-redis Pipelined or
// TxPipelined call, and whether it is the MULTI/EXEC one.
func pipelined(pass *analysis.Pass, call *ast.CallExpr) (*ast.FuncLit, bool) {
	fn, name := goRedisMethod(pass, call)
	if fn == nil || name != "Pipelined" && name != "TxPipelined" {
		return nil, false
	}
	for _, a := range call.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			return lit, name == "TxPipelined"
		}
	}
	return nil, false
}

// txPipe returns the group of a command sent on a variable that holds a
// go-redis TxPipeline (MULTI/EXEC), nil otherwise.
func (st *analysisState) txPipe(s *fnScope, call *ast.CallExpr) any {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	id, ok := ast.Unparen(sel.X).(*ast.Ident)
	if !ok {
		return nil
	}
	o := st.pass.TypesInfo.ObjectOf(id)
	d, ok := s.defs[o]
	if !ok {
		return nil
	}
	if c, ok := ast.Unparen(d).(*ast.CallExpr); ok {
		if fn, name := goRedisMethod(st.pass, c); fn != nil && name == "TxPipeline" {
			return o
		}
	}
	return nil
}

// findWatched marks the functions passed to go-redis' Watch: literals, local
// variables that hold one, and named functions or methods of the package.
func (st *analysisState) findWatched(f *ast.File) {
	pass := st.pass
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || !isWatch(pass, call) {
			return true
		}
		for _, a := range call.Args {
			switch x := ast.Unparen(a).(type) {
			case *ast.FuncLit:
				st.watched[x.Body] = true
			case *ast.Ident, *ast.SelectorExpr:
				var obj types.Object
				if id, ok := x.(*ast.Ident); ok {
					obj = pass.TypesInfo.Uses[id]
				} else {
					obj = pass.TypesInfo.Uses[x.(*ast.SelectorExpr).Sel]
				}
				switch o := obj.(type) {
				case *types.Func:
					if fd := st.decls[o]; fd != nil {
						st.watched[fd.Body] = true
					}
				case *types.Var:
					if lit := litOf(f, pass, o); lit != nil {
						st.watched[lit.Body] = true
					}
				}
			case *ast.CallExpr: // a function built by a call: the literals its callee returns
				for _, lit := range st.builtLits(x) {
					st.watched[lit.Body] = true
				}
			}
		}
		return true
	})
}

// builtLits returns the function literals that call, a call of a function
// or method of this package that builds one (q.watcher(key)), or of a
// struct field set to such a function, returns: each a return of its body.
func (st *analysisState) builtLits(call *ast.CallExpr) []*ast.FuncLit {
	var builders []*ast.FuncLit
	var bodies []*ast.BlockStmt
	if fn := calleeOf(st.pass, call); fn != nil {
		if fd := st.decls[fn]; fd != nil {
			bodies = append(bodies, fd.Body)
		}
	} else if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
		// A field of func type: what the package sets it to.
		if field, ok := st.pass.TypesInfo.Uses[sel.Sel].(*types.Var); ok && field.IsField() {
			for _, f := range st.pass.Files {
				ast.Inspect(f, func(n ast.Node) bool {
					switch x := n.(type) {
					case *ast.KeyValueExpr: // watchQueue{build: q.watcher}
						if id, ok := x.Key.(*ast.Ident); ok && st.pass.TypesInfo.Uses[id] == field {
							builders = append(builders, st.funcValue(x.Value, &bodies)...)
						}
					case *ast.AssignStmt: // q.build = q.watcher
						for i, l := range x.Lhs {
							if ls, ok := l.(*ast.SelectorExpr); ok && i < len(x.Rhs) && st.pass.TypesInfo.Uses[ls.Sel] == field {
								builders = append(builders, st.funcValue(x.Rhs[i], &bodies)...)
							}
						}
					}
					return true
				})
			}
		}
	}
	for _, b := range builders {
		bodies = append(bodies, b.Body)
	}
	var out []*ast.FuncLit
	for _, body := range bodies {
		ast.Inspect(body, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.FuncLit:
				if x.Body != body {
					return false // a return of another literal is that one's
				}
			case *ast.ReturnStmt:
				for _, r := range x.Results {
					if lit, ok := ast.Unparen(r).(*ast.FuncLit); ok {
						out = append(out, lit)
					}
				}
			}
			return true
		})
	}
	return out
}

// funcValue returns e where it is a function literal, and adds the body
// of the package's function or method e names to bodies.
func (st *analysisState) funcValue(e ast.Expr, bodies *[]*ast.BlockStmt) []*ast.FuncLit {
	switch x := ast.Unparen(e).(type) {
	case *ast.FuncLit:
		return []*ast.FuncLit{x}
	case *ast.Ident, *ast.SelectorExpr:
		id, _ := x.(*ast.Ident)
		if sel, ok := x.(*ast.SelectorExpr); ok {
			id = sel.Sel
		}
		if fn, ok := st.pass.TypesInfo.Uses[id].(*types.Func); ok && st.decls[fn] != nil {
			*bodies = append(*bodies, st.decls[fn].Body)
		}
	}
	return nil
}

// litOf finds the function literal a variable is defined as.
func litOf(f *ast.File, pass *analysis.Pass, v *types.Var) *ast.FuncLit {
	var lit *ast.FuncLit
	ast.Inspect(f, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != len(as.Rhs) {
			return lit == nil
		}
		for i, l := range as.Lhs {
			if id, ok := l.(*ast.Ident); ok && pass.TypesInfo.ObjectOf(id) == v {
				if fl, ok := ast.Unparen(as.Rhs[i]).(*ast.FuncLit); ok {
					lit = fl
				}
			}
		}
		return lit == nil
	})
	return lit
}

// isWatch reports a call of go-redis' Watch: its function runs in an
// optimistic transaction.
func isWatch(pass *analysis.Pass, call *ast.CallExpr) bool {
	fn, name := goRedisMethod(pass, call)
	return fn != nil && name == "Watch"
}

// discard marks the calls of f whose replies the code throws away: the
// first value assigned to _ (of the reply, of a method of it such as Val,
// Result or AsStrSlice, or of a redigo reply helper of it), or only the
// error asked for (Err, or rueidis' Error). A read of due members
// whose members no one gets polls nothing: it checks that the key can be
// read, before a removal of what has expired, say.
func (st *analysisState) discard(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.AssignStmt:
			if len(x.Rhs) != 1 || len(x.Lhs) == 0 {
				break
			}
			if id, ok := x.Lhs[0].(*ast.Ident); !ok || id.Name != "_" {
				break
			}
			call, ok := ast.Unparen(x.Rhs[0]).(*ast.CallExpr)
			if !ok {
				break
			}
			st.discarded[call] = true
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && len(call.Args) == 0 {
				if inner, ok := ast.Unparen(sel.X).(*ast.CallExpr); ok {
					st.discarded[inner] = true
				}
			}
			if fn := typeutil.StaticCallee(st.pass.TypesInfo, call); fn != nil && fn.Pkg() != nil && isRedigo(fn.Pkg().Path()) && len(call.Args) == 1 {
				if inner, ok := ast.Unparen(call.Args[0]).(*ast.CallExpr); ok {
					st.discarded[inner] = true
				}
			}
		case *ast.SelectorExpr:
			if x.Sel.Name == "Err" || x.Sel.Name == "Error" {
				if call, ok := ast.Unparen(x.X).(*ast.CallExpr); ok {
					st.discarded[call] = true
				}
			}
		}
		return true
	})
}

// take marks the calls of f whose values the code takes: assigned, or
// returned (inPlaceLiterals reads them).
func (st *analysisState) take(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		var values []ast.Expr
		switch x := n.(type) {
		case *ast.AssignStmt:
			values = x.Rhs
		case *ast.ReturnStmt:
			values = x.Results
		}
		for _, e := range values {
			if call, ok := ast.Unparen(e).(*ast.CallExpr); ok {
				st.taken[call] = true
			}
		}
		return true
	})
}
