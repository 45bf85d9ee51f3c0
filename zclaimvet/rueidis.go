package zclaimvet

// rueidis, and valkey-go (its fork): a command is built with the client's
// builder, client.B().Zrangebyscore().Key(k).Min(a).Max(b).Build(), and
// sent with Do or DoCache, or with others in DoMulti (a pipeline, in which
// MULTI ... EXEC is one transaction), as its arguments or gathered in a
// slice first.

import (
	"go/ast"
	"go/types"
	"strings"
)

func isRueidis(path string) bool {
	return strings.HasPrefix(path, "github.com/redis/rueidis") || strings.HasPrefix(path, "github.com/valkey-io/valkey-go")
}

// isCompat reports the go-redis-like adapters of rueidis and valkey-go
// (rueidiscompat, valkeycompat): their methods are read as go-redis'.
func isCompat(path string) bool {
	return path == "github.com/redis/rueidis/rueidiscompat" || path == "github.com/valkey-io/valkey-go/valkeycompat"
}

// sendsBuilt reports whether fn may send commands built with rueidis' or
// valkey-go's builder: it is theirs (but for the go-redis-like adapters),
// or it is a Do, DoCache, DoMulti or DoMultiCache whose command parameter,
// the second, is such a command (isBuiltCmd): a method of an interface a
// project declares over the client, or of a wrapper of its own.
func sendsBuilt(fn *types.Func) bool {
	if fn.Pkg() == nil {
		return false
	}
	if p := fn.Pkg().Path(); isRueidis(p) {
		return !isCompat(p)
	}
	switch fn.Name() {
	case "Do", "DoCache", "DoMulti", "DoMultiCache":
	default:
		return false
	}
	sig, ok := fn.Type().(*types.Signature)
	return ok && sig.Params().Len() >= 2 && isBuiltCmd(sig.Params().At(1).Type())
}

// givesBuilder reports whether fn is rueidis' or valkey-go's (but for the
// go-redis-like adapters'), or a B() that returns their builder (a
// project's interface over the client, or its wrapper).
func givesBuilder(fn *types.Func) bool {
	if fn.Pkg() == nil {
		return false
	}
	if p := fn.Pkg().Path(); isRueidis(p) {
		return !isCompat(p)
	}
	sig, ok := fn.Type().(*types.Signature)
	if !ok || fn.Name() != "B" || sig.Params().Len() != 0 || sig.Results().Len() != 1 {
		return false
	}
	n, ok := types.Unalias(sig.Results().At(0).Type()).(*types.Named)
	return ok && n.Obj().Pkg() != nil && isRueidis(n.Obj().Pkg().Path())
}

// built is a command read off a builder chain.
type built struct {
	cmd    string                // the command: the builder's method after B(), upper case
	key    ast.Expr              // the argument of Key, if any
	opts   map[string][]ast.Expr // the later methods, upper case, with their arguments
	spread bool                  // an argument of Member is spread
}

// sentBuilt returns the built commands that call sends with rueidis'
// Do or DoCache (one) or DoMulti or DoMultiCache (multi: several, also
// spread from a slice appended to).
func (st *analysisState) sentBuilt(s *fnScope, call *ast.CallExpr) (cmds []ast.Expr, multi, ok bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil, false, false
	}
	fn, ok := st.pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || !sendsBuilt(fn) || len(call.Args) < 2 {
		return nil, false, false
	}
	switch sel.Sel.Name {
	case "Do", "DoCache":
		return call.Args[1:2], false, true
	case "DoMulti", "DoMultiCache":
		if call.Ellipsis.IsValid() {
			return st.appended(s, call.Args[len(call.Args)-1]), true, true
		}
		return call.Args[1:], true, true
	}
	return nil, false, false
}

// rueidisEvents returns the accesses and claims that call sends, whether
// it sends a WATCH (the function is then a WATCH transaction, as a
// redigo WATCH makes it), and whether it is a rueidis Do, DoCache or
// DoMulti.
func (st *analysisState) rueidisEvents(s *fnScope, call *ast.CallExpr, group any) (evs []event, watch, ok bool) {
	cmds, multi, ok := st.sentBuilt(s, call)
	if !ok {
		return nil, false, false
	}
	var txn any // a MULTI in progress
	for _, c := range cmds {
		b, ok := st.builtCmd(s, c)
		if !ok {
			continue
		}
		switch b.cmd {
		case "WATCH":
			watch = true
			continue
		case "MULTI":
			txn = c
			continue
		case "EXEC", "DISCARD":
			txn = nil
			continue
		}
		ev, ok := st.builtEvent(s, call, b)
		if !ok {
			continue
		}
		if multi {
			// A count among the pipeline's replies: checked where a reply
			// is tested (the replies of its other commands count too).
			ev.Checked = ev.Name == "ZREM" && !ev.Batch && !ev.Forward && st.repliesTested(s, call)
		}
		ev.group = group
		if txn != nil {
			ev.group = txn
		}
		evs = append(evs, ev)
	}
	return evs, watch, true
}

// appended returns the commands a local slice of this function is given,
// in the order of the source: the elements of its literals and the values
// appended to it (c.DoMulti(ctx, cmds...) after cmds = append(cmds, ...)).
func (st *analysisState) appended(s *fnScope, e ast.Expr) []ast.Expr {
	id, ok := ast.Unparen(e).(*ast.Ident)
	if !ok {
		return nil
	}
	var out []ast.Expr
	for _, v := range s.values[st.pass.TypesInfo.ObjectOf(id)] {
		switch x := ast.Unparen(v).(type) {
		case *ast.CompositeLit:
			out = append(out, x.Elts...)
		case *ast.CallExpr:
			if f, ok := ast.Unparen(x.Fun).(*ast.Ident); ok && f.Name == "append" && len(x.Args) > 1 {
				elems := x.Args[1:]
				if x.Ellipsis.IsValid() {
					elems = elems[:len(elems)-1]
				}
				out = append(out, elems...)
			}
		}
	}
	return out
}

// builtCmd reads the builder chain of e, directly or through a local
// assigned once.
func (st *analysisState) builtCmd(s *fnScope, e ast.Expr) (built, bool) {
	pass := st.pass
	e = ast.Unparen(e)
	if id, ok := e.(*ast.Ident); ok {
		d, ok := s.defs[pass.TypesInfo.ObjectOf(id)]
		if !ok {
			return built{}, false
		}
		e = ast.Unparen(d)
	}
	var steps []*ast.CallExpr // outermost first
	for {
		call, ok := e.(*ast.CallExpr)
		if !ok {
			return built{}, false
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return built{}, false
		}
		if sel.Sel.Name == "B" && len(call.Args) == 0 {
			fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
			if !ok || !givesBuilder(fn) || len(steps) == 0 {
				return built{}, false
			}
			break
		}
		steps = append(steps, call)
		e = ast.Unparen(sel.X)
	}
	name := func(c *ast.CallExpr) string { return strings.ToUpper(c.Fun.(*ast.SelectorExpr).Sel.Name) }
	b := built{cmd: name(steps[len(steps)-1]), opts: map[string][]ast.Expr{}}
	for i := len(steps) - 2; i >= 0; i-- {
		c := steps[i]
		n := name(c)
		if n == "KEY" && b.key == nil && len(c.Args) > 0 {
			b.key = c.Args[0]
		}
		if n == "MEMBER" && c.Ellipsis.IsValid() {
			b.spread = true
		}
		b.opts[n] = append(b.opts[n], c.Args...)
		if b.opts[n] == nil {
			b.opts[n] = []ast.Expr{} // a flag: present, with no arguments
		}
	}
	return b, true
}

// builtEvent is the access or claim that command b, sent by call, makes.
func (st *analysisState) builtEvent(s *fnScope, call *ast.CallExpr, b built) (event, bool) {
	pass := st.pass
	if claimCmds[b.cmd] || b.cmd == "SET" && b.opts["NX"] != nil {
		lock := lockNames[b.cmd]
		if b.cmd == "SET" {
			lock = "SET NX"
		}
		var key string // what a DEL must name to let a SET NX go
		if b.key != nil {
			key = st.norm(s, b.key, 0)
		}
		return event{node: call, claim: true, Access: Access{Name: lock, Key: key, Pos: pos(pass, call)}}, true
	}
	if b.key == nil {
		return event{}, false
	}
	has := func(flag string) bool { return b.opts[flag] != nil }
	members := b.opts["MEMBER"]
	if b.cmd == "ZADD" {
		members = b.opts["SCOREMEMBER"] // ScoreMember(score, member), a pair a call
	}
	return st.zsetCommand(s, call, b.cmd, b.key, has, members, b.spread)
}

// isResult reports rueidis' reply type, whose As and To methods give the
// value and Error its error.
func isResult(t types.Type) bool {
	named, ok := t.(*types.Named)
	return ok && named.Obj().Pkg() != nil && isRueidis(named.Obj().Pkg().Path()) && strings.HasSuffix(named.Obj().Name(), "Result")
}
