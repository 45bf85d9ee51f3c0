package zclaimvet

// Cleanups: a removal of one member, on a path that then only logs and
// leaves, in a function that on another path hands the same member to a
// Lua script among whose keys is the removal's key, or removes it from
// that key again (a mover that drops a member it cannot parse, and takes
// the others by a removal of their own). The script takes what
// it is handed (a script is taken to claim the members it takes, as it is
// where no plain removal stands beside one, unless its source is in the
// code and shows it removing them unasked: lua.go, whose removal is then
// paired as any other); the removal drops a member the script is not handed,
// such as a reaper's entry whose job record is gone. Nothing runs on the
// member after the removal, so two workers that both remove it run nothing
// twice: the removal is paired with no read, here or in a caller.
// Where the removal's path goes on to act on the member, or no script is
// handed it, the removal is a poll's as any other.

import (
	"go/ast"
	"go/token"
	"go/types"
	"slices"
)

// markCleanups sets cleanup on the removals among evs, events of the
// function of s, that drop a member a script or another removal takes on
// another path.
func (st *analysisState) markCleanups(s *fnScope, evs []event) []event {
	for i := range evs {
		evs[i].cleanup = st.cleanup(s, evs[i], evs)
	}
	return evs
}

// cleanup reports whether ev is such a removal: one member held in a
// variable, removed by a statement that, with those after it in its block,
// only makes quiet calls (sweep: the removal, reads, a log line) and whose
// block ends in a return or a continue; and a script call outside that
// block is handed the member, with the removal's key among its keys, or
// another removal of evs outside it removes the member from that key.
func (st *analysisState) cleanup(s *fnScope, ev event, evs []event) bool {
	if ev.member == nil || ev.Checked || ev.Read || ev.claim {
		return false
	}
	info := st.pass.TypesInfo
	id, ok := ast.Unparen(ev.member).(*ast.Ident)
	if !ok || info.ObjectOf(id) == nil {
		return false
	}
	member := map[types.Object]bool{info.ObjectOf(id): true}
	// The block of the statement that sends the removal, and where in it.
	var blk *ast.BlockStmt
	at := -1
	for n := ev.node; n != nil && blk == nil; n = s.parent[n] {
		b, ok := s.parent[n].(*ast.BlockStmt)
		if !ok {
			continue
		}
		for i, stmt := range b.List {
			if stmt == n {
				blk, at = b, i
			}
		}
	}
	if blk == nil || blk == s.body {
		return false // the function's own body: no other path
	}
	switch last := blk.List[len(blk.List)-1].(type) {
	case *ast.ReturnStmt:
	case *ast.BranchStmt:
		if last.Tok != token.CONTINUE {
			return false
		}
	default:
		return false
	}
	sw := &sweeper{st: st, body: s.body, tainted: member}
	if !sw.quietUses(blk.List[at:], false) {
		return false
	}
	handed := slices.ContainsFunc(evs, func(e event) bool {
		return e.member != nil && !e.Read && !e.Score && !e.claim && e.Key == ev.Key &&
			!within(e.node, blk) && mentionsAny(info, member, e.member)
	})
	ast.Inspect(s.body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || handed || within(call, blk) {
			return !handed
		}
		sc, ok := st.scriptCall(s, call)
		if !ok || !slices.ContainsFunc(sc.args, func(a ast.Expr) bool { return mentionsAny(info, member, a) }) {
			return true
		}
		for _, k := range sc.elts {
			handed = handed || st.norm(s, k, 0) == ev.Key
		}
		return !handed
	})
	return handed
}

// scriptArgs is what a call hands a Lua script.
type scriptArgs struct {
	keys ast.Expr   // the keys as one slice (go-redis, a Runs helper), or nil
	elts []ast.Expr // the keys one by one, where the call's code names them
	args []ast.Expr // the arguments
}

// scriptCall returns what call hands to a Lua script: a go-redis call that
// runs one (goRedisScript: the keys the first []string argument, the
// arguments those after it), an EVAL sent by name (the keys after the
// script and their count), a redigo Script's Do, DoContext, Send or
// SendHash (its keys the first of its keysAndArgs, as many as NewScript
// was told), or a call of a function whose summary runs one (Runs).
func (st *analysisState) scriptCall(s *fnScope, call *ast.CallExpr) (scriptArgs, bool) {
	elts := func(keys ast.Expr) []ast.Expr {
		if lit := st.literalOf(s, keys); lit != nil {
			return lit.Elts
		}
		return nil
	}
	if st.goRedisScript(call) {
		for i, a := range call.Args {
			if sl, ok := st.pass.TypesInfo.TypeOf(a).(*types.Slice); ok {
				if b, ok := sl.Elem().(*types.Basic); ok && b.Kind() == types.String {
					return scriptArgs{keys: a, elts: elts(a), args: call.Args[i+1:]}, true
				}
			}
		}
		return scriptArgs{}, false
	}
	if na, ok := evalByName(st.pass, call); ok {
		return st.splitKeys(call, na[2], na[3:])
	}
	if mk, kv, ok := st.redigoScript(s, call); ok {
		return st.splitKeys(call, mk.Args[0], kv)
	}
	fn := calleeOf(st.pass, call)
	if fn == nil {
		return scriptArgs{}, false
	}
	if sum := st.summaryOf(fn); sum != nil && sum.Runs != nil && len(call.Args) > sum.Runs.Args {
		k := call.Args[sum.Runs.Keys]
		return scriptArgs{keys: k, elts: elts(k), args: call.Args[sum.Runs.Args:]}, true
	}
	return scriptArgs{}, false
}

// splitKeys splits kv, the keys and arguments call hands a script after
// their count (an EVAL's numkeys, a redigo NewScript's keyCount), into the
// keys, the first count of them, and the arguments; a count that is no
// constant, or a spread that may hold keys, does not split.
func (st *analysisState) splitKeys(call *ast.CallExpr, count ast.Expr, kv []ast.Expr) (scriptArgs, bool) {
	n, ok := constInt(st.pass, count)
	if !ok || n < 0 || n > len(kv) || call.Ellipsis.IsValid() && n >= len(kv) {
		return scriptArgs{}, false
	}
	return scriptArgs{elts: kv[:n], args: kv[n:]}, true
}

// runs recognizes a function that runs a script with its parameter keys
// as the keys and its variadic parameter spread as the arguments: a
// registry's run(ctx, rdb, name, keys, args...) that calls a Script's Run,
// or a helper's exec(ctx, src, keys, args...) that makes its script of a
// parameter (Src).
func (st *analysisState) runs(s *fnScope, fd *ast.FuncDecl) *Runs {
	info := st.pass.TypesInfo
	var out *Runs
	param := func(e ast.Expr) int {
		if id, ok := ast.Unparen(e).(*ast.Ident); ok {
			if i, ok := s.params[info.ObjectOf(id)]; ok {
				return i
			}
		}
		return -1
	}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || out != nil || !call.Ellipsis.IsValid() {
			return out == nil
		}
		sc, ok := st.scriptCall(s, call)
		if !ok || len(sc.args) != 1 || sc.keys == nil {
			return true
		}
		if k, a := param(sc.keys), param(sc.args[0]); k >= 0 && a >= 0 {
			out = &Runs{Keys: k, Args: a, Src: st.sourceParam(s, call) + 1}
		}
		return out == nil
	})
	return out
}
