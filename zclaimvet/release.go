package zclaimvet

// Releases: a lock on one member let go in the function that took it. A
// SET NX of the member's lock key is a claim only while the key lives: a
// poller that takes it after the read, runs the job, removes the member
// and then deletes the key (or unlocks a lock library's lock, or calls a
// helper that does) lets a second worker, which read the member before
// the removal, take the lock after the release and run the job again.

import (
	"go/ast"
	"go/token"
	"strings"
	"unicode"
)

// release is a lock let go: a DEL or UNLINK of key, or (key "") a lock
// library's Release or Unlock, or a call of an unlock helper (Summary's
// Unlock).
type release struct {
	pos      token.Pos
	key      string
	deferred bool // in a defer statement: sent when the function returns
	at       string
	scope    *fnScope
}

// releases returns the locks body lets go, in source order, those of the
// function literals within it included.
func (st *analysisState) releases(s *fnScope, body ast.Node) []release {
	var out []release
	var visit func(n ast.Node, deferred bool) bool
	visit = func(n ast.Node, deferred bool) bool {
		switch x := n.(type) {
		case *ast.DeferStmt:
			ast.Inspect(x.Call, func(n ast.Node) bool { return visit(n, true) })
			return false
		case *ast.CallExpr:
			keys, ok := st.releaseOf(s, x)
			if !ok {
				return true
			}
			if len(keys) == 0 {
				keys = []string{""}
			}
			for _, k := range keys {
				out = append(out, release{pos: x.Pos(), key: k, deferred: deferred, at: pos(st.pass, x), scope: s})
			}
		}
		return true
	}
	ast.Inspect(body, func(n ast.Node) bool { return visit(n, false) })
	return out
}

// releaseOf tells whether call lets a lock go, and the keys it deletes
// (none for a library's or a helper's release).
func (st *analysisState) releaseOf(s *fnScope, call *ast.CallExpr) (keys []string, ok bool) {
	pass := st.pass
	var args []ast.Expr
	if fn, name := goRedisMethod(pass, call); fn != nil {
		switch k := keyIndex(fn); {
		case name == "Del" || name == "Unlink":
			args = call.Args[min(k, len(call.Args)):]
		case name == "Do" && len(call.Args) > k:
			args = call.Args[k:]
			if c, ok := stringConst(pass, args[0]); !ok || !deletes(c) {
				return nil, false
			}
			args = args[1:]
		default:
			return nil, false
		}
	} else if named, ok := namedArgs(pass, call); ok {
		if c, ok := stringConst(pass, named[0]); !ok || !deletes(c) {
			return nil, false
		}
		args = named[1:]
	} else if st.lockLibraryRelease(call) || st.unlockHelper(call) {
		return nil, true
	} else if cmds, _, ok := st.sentBuilt(s, call); ok {
		// rueidis: a built DEL or UNLINK, alone or among others.
		for _, c := range cmds {
			if b, ok := st.builtCmd(s, c); ok && deletes(b.cmd) {
				args = append(args, b.opts["KEY"]...)
			}
		}
	} else {
		return nil, false
	}
	for _, a := range args {
		keys = append(keys, st.norm(s, a, 0))
	}
	return keys, len(keys) > 0
}

// claimKey returns the key of a SET NX (or SETNX) that call sends,
// normalized, or "": what a DEL must name to let that claim go.
func (st *analysisState) claimKey(s *fnScope, call *ast.CallExpr) string {
	pass := st.pass
	var args []ast.Expr
	if fn, name := goRedisMethod(pass, call); fn != nil {
		k := keyIndex(fn)
		switch {
		case (name == "SetNX" || name == "SetArgs") && len(call.Args) > k:
			return st.norm(s, call.Args[k], 0)
		case name == "Do":
			args = call.Args[min(k, len(call.Args)):]
		}
	} else if named, ok := namedArgs(pass, call); ok {
		args = named
	}
	if len(args) < 2 {
		return ""
	}
	if c, ok := stringConst(pass, args[0]); ok && (strings.EqualFold(c, "SET") || strings.EqualFold(c, "SETNX")) {
		return st.norm(s, args[1], 0)
	}
	return ""
}

func deletes(cmd string) bool {
	return strings.EqualFold(cmd, "DEL") || strings.EqualFold(cmd, "UNLINK")
}

// lockLibraryRelease reports a call that lets a distributed-lock library's
// lock go: redislock's Release, redsync Mutex's Unlock and UnlockContext.
func (st *analysisState) lockLibraryRelease(call *ast.CallExpr) bool {
	fn := calleeOf(st.pass, call)
	if fn == nil || fn.Pkg() == nil {
		return false
	}
	path, name := fn.Pkg().Path(), fn.Name()
	switch {
	case strings.HasPrefix(path, "github.com/go-redsync/redsync") || strings.HasPrefix(path, "github.com/hjr265/redsync.go/"):
		return name == "Unlock" || name == "UnlockContext"
	case strings.HasPrefix(path, "github.com/bsm/redislock"):
		return name == "Release"
	}
	return false
}

// unlockHelper reports a call of a function whose summary says it lets a
// lock go (Summary's Unlock).
func (st *analysisState) unlockHelper(call *ast.CallExpr) bool {
	fn := calleeOf(st.pass, call)
	if fn == nil {
		return false
	}
	sum := st.summaryOf(fn)
	return sum != nil && sum.Unlock
}

// isUnlock reports whether a function named name, which lets go the locks
// rels, is an unlock helper: named for it (unlockName) and sending a DEL,
// an UNLINK or a lock library's release. A compare-and-delete script is
// also how locks are let go: a helper so named that runs a script (evals)
// counts too.
func isUnlock(name string, rels []release, evals bool) bool {
	return unlockName(name) && (len(rels) > 0 || evals)
}

// unlockName reports a name for letting a lock go: "unlock" in it, or the
// word "release" first (Release, releaseLock, release_lock; not
// releasedJobs).
func unlockName(name string) bool {
	const w = "release"
	if strings.Contains(strings.ToLower(name), "unlock") {
		return true
	}
	if len(name) < len(w) || !strings.EqualFold(name[:len(w)], w) {
		return false
	}
	rest := name[len(w):]
	return rest == "" || rest[0] == '_' || unicode.IsUpper(rune(rest[0]))
}

// sendsScript reports whether body runs a Lua script: go-redis' Eval,
// EvalSha, EvalRO, EvalShaRO or a Script's Run, or an EVAL or EVALSHA sent
// by name.
func (st *analysisState) sendsScript(body ast.Node) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || found {
			return !found
		}
		if st.goRedisScript(call) {
			found = true
		} else if cmd, ok := namedCmd(st.pass, call); ok && strings.HasPrefix(cmd, "EVAL") {
			found = true
		}
		return !found
	})
	return found
}

// goRedisScript reports a go-redis call (or an adapter's) that runs a Lua
// script: a client's Eval, EvalSha, EvalRO or EvalShaRO, or a Script's
// Run, RunRO or Eval*.
func (st *analysisState) goRedisScript(call *ast.CallExpr) bool {
	if _, name := goRedisMethod(st.pass, call); strings.HasPrefix(name, "Eval") {
		return true
	}
	fn := calleeOf(st.pass, call)
	return fn != nil && fn.Pkg() != nil && isGoRedis(fn.Pkg().Path()) && (fn.Name() == "Run" || fn.Name() == "RunRO")
}

// releasedAt returns the release that lets claim c go after removal rm
// (or, deferred, after c: when the function returns), or nil. A DEL lets
// go the SET NX of its key; a library's release or a helper's any lock.
func releasedAt(c, rm event, rels []release) *release {
	if c.Name == "" {
		return nil // a pop: nothing to let go
	}
	for k := range rels {
		r := &rels[k]
		if r.key != "" && r.key != c.Key {
			continue
		}
		if r.deferred && r.pos > c.node.Pos() || r.pos > rm.node.Pos() && !r.scope.bypasses(rm.node, r.pos) {
			return r
		}
	}
	return nil
}

// bypasses reports whether the path through n never reaches pos, which
// follows it in the source: the code after n leaves the blocks around it
// before pos (a return or goto; a break or continue whose loop, switch or
// select holds pos), or n and pos lie on branches of which one runs (an
// if's body and its else, two clauses of a switch or select that n's does
// not fall through from). So a success path that keeps the lock and goes
// on, the release being the failure path's.
func (s *fnScope) bypasses(n ast.Node, pos token.Pos) bool {
	holds := func(x ast.Node) bool { return x != nil && pos >= x.Pos() && pos < x.End() }
	var stmt ast.Node = n
	for p := s.parent[n]; p != nil; stmt, p = p, s.parent[p] {
		if holds(p) {
			switch x := p.(type) {
			case *ast.IfStmt:
				return stmt == x.Body && holds(x.Else)
			case *ast.BlockStmt: // a switch's or select's body: pos in another clause
				switch c := stmt.(type) {
				case *ast.CaseClause:
					return len(c.Body) == 0 || !isFallthrough(c.Body[len(c.Body)-1])
				case *ast.CommClause:
					return true
				}
			}
			return false
		}
		var list []ast.Stmt
		switch b := p.(type) {
		case *ast.BlockStmt:
			list = b.List
		case *ast.CaseClause:
			list = b.Body
		case *ast.CommClause:
			list = b.Body
		default:
			continue
		}
		for _, st := range list {
			if st.Pos() <= stmt.Pos() {
				continue
			}
			switch x := st.(type) {
			case *ast.ReturnStmt:
				return true
			case *ast.BranchStmt:
				switch x.Tok {
				case token.GOTO:
					return true
				case token.BREAK, token.CONTINUE:
					// Out of its loop, switch or select, and on after it.
					return holds(s.branchTarget(x))
				}
			}
		}
	}
	return false
}

func isFallthrough(st ast.Stmt) bool {
	b, ok := st.(*ast.BranchStmt)
	return ok && b.Tok == token.FALLTHROUGH
}

// branchTarget returns the statement a break or continue leaves: the one
// its label names, else the innermost loop (or, for a break, switch or
// select) around it, or nil.
func (s *fnScope) branchTarget(b *ast.BranchStmt) ast.Node {
	for p := s.parent[b]; p != nil; p = s.parent[p] {
		switch x := p.(type) {
		case *ast.FuncLit:
			return nil
		case *ast.LabeledStmt:
			if b.Label != nil && x.Label.Name == b.Label.Name {
				return x
			}
		case *ast.ForStmt, *ast.RangeStmt:
			if b.Label == nil {
				return x
			}
		case *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt:
			if b.Label == nil && b.Tok == token.BREAK {
				return x
			}
		}
	}
	return nil
}
