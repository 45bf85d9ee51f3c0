package zclaimvet

// Sweeps: a read whose members go nowhere but back to Redis, to be read or
// removed (an expiry sweep of an index, say). Two workers that read the same
// member then run nothing twice between them, so the pair is not reported.

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"slices"
	"strings"
)

// countCmds remove and answer a count; readCmds answer what they read.
// Neither writes a member anywhere or hands it on: they are quiet.
var (
	countCmds = map[string]bool{
		"DEL": true, "UNLINK": true, "ZREM": true, "ZREMRANGEBYSCORE": true, "ZREMRANGEBYRANK": true,
		"HDEL": true, "SREM": true, "LREM": true,
	}
	readCmds = map[string]bool{
		"GET": true, "MGET": true, "HGET": true, "HMGET": true, "HGETALL": true, "EXISTS": true, "TTL": true,
		"PTTL": true, "ZSCORE": true, "ZMSCORE": true, "TYPE": true, "STRLEN": true, "HEXISTS": true, "SISMEMBER": true,
		"ZRANGE": true, "ZRANGEBYSCORE": true, "ZREVRANGEBYSCORE": true, "ZREVRANGE": true, "ZCARD": true, "ZCOUNT": true,
	}
)

// quietPkgs hold functions that compute and have no effect outside the
// program (fmt is quiet only for its Sprint and Errorf functions).
var quietPkgs = map[string]bool{
	"strings": true, "strconv": true, "bytes": true, "errors": true, "encoding/json": true,
	"encoding/base64": true, "encoding/hex": true, "unicode/utf8": true, "math": true, "time": true,
	"context": true, "slices": true, "maps": true, "sort": true,
}

// sweep reports whether read r and removal rm, calls in body, are a
// sweep: r (sent here, or by a function of the package that only reads
// and returns: quietFunc) puts its members in a variable, and they, and
// what is computed of them or read from Redis with them, go nowhere but
// back to Redis (how many there are, len or cap of them, is no member and
// may go anywhere):
//   - only into quiet statements, whose every call is quiet (rm, other
//     reads and removals, builders of such commands, len, append,
//     conversions, decoding, a log line, a function of the package that
//     only makes quiet calls and returns a quiet expression, such as a
//     key's name);
//   - a range over them does nothing but such statements, ifs of them,
//     continue and break;
//   - a return outside such a range returns a count that a removal
//     answered, if anything of them;
//   - one of them goes into rm, or into a removal that rm sends; where rm
//     is a helper's of the package, the helper is handed them and sweeps
//     them by the same rule (helperSweeps).
//
// Anything else acts on a member, and r is a poll: a return in such a
// range or of a member, a member kept outside the function (in a field, a
// parameter's slice, a package variable), a go or defer statement, a send
// on a channel, a write (a push to another key), a member printed
// (fmt.Print, which in a demo stands for the work) or written to an
// io.Writer (fmt.Fprint), a call of anything else.
func (st *analysisState) sweep(r, rm event, body ast.Node) bool {
	blk, ok := body.(*ast.BlockStmt)
	if !ok || r.callee != nil && !st.quietFunc(r.callee, 0) {
		return false // a read through a function that does more than read and return
	}
	held := st.heldBy(r, body)
	if held == nil {
		return false
	}
	sw := &sweeper{st: st, body: body, tainted: st.tainted(body, held)}
	if c, ok := rm.node.(*ast.CallExpr); ok && rm.Moves {
		sw.moved = c
	}
	if rm.callee != nil {
		// A helper of the package removes: it is handed members, and
		// sweeps them itself; its call is quiet here.
		call, ok := rm.node.(*ast.CallExpr)
		if !ok || !st.helperSweeps(call, rm.callee, sw.tainted) {
			return false
		}
		sw.helper = call
		return sw.quietUses(blk.List, false)
	}
	return sw.removes(rm.node) && sw.quietUses(blk.List, false)
}

// heldBy returns the variable that read r's statement in body puts the
// members in (radix: its receiver), or nil.
func (st *analysisState) heldBy(r event, body ast.Node) types.Object {
	info := st.pass.TypesInfo
	var held types.Object
	if call, ok := r.node.(*ast.CallExpr); ok {
		if _, rcv, ok := radixCmd(st.pass, call); ok {
			if u, ok := ast.Unparen(rcv).(*ast.UnaryExpr); ok && u.Op == token.AND {
				if id, ok := ast.Unparen(u.X).(*ast.Ident); ok {
					held = info.ObjectOf(id)
				}
			}
		}
	}
	ast.Inspect(body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || held != nil || len(as.Rhs) != 1 || !within(r.node, as.Rhs[0]) {
			return held == nil
		}
		if id, ok := as.Lhs[0].(*ast.Ident); ok {
			held = info.ObjectOf(id)
		}
		return false
	})
	return held
}

// helperSweeps reports whether fn, a function of this package that call
// hands members (tainted) to, sweeps them: the parameters given them go
// only into quiet statements in its body, one into a removal, and it
// returns nothing but errors and integers.
func (st *analysisState) helperSweeps(call *ast.CallExpr, fn *types.Func, tainted map[types.Object]bool) bool {
	info := st.pass.TypesInfo
	fd := st.decls[fn]
	sig, ok := fn.Type().(*types.Signature)
	if fd == nil || fd.Body == nil || !ok {
		return false
	}
	for i := range sig.Results().Len() {
		t := sig.Results().At(i).Type()
		b, isBasic := t.Underlying().(*types.Basic)
		if !isError(t) && !(isBasic && b.Info()&types.IsInteger != 0) {
			return false
		}
	}
	var params []*ast.Ident
	for _, f := range fd.Type.Params.List {
		params = append(params, f.Names...)
	}
	var seeds []types.Object
	for i, a := range call.Args {
		if !mentionsAny(info, tainted, a) {
			continue
		}
		if i >= len(params) || params[i].Name == "_" {
			return false // unnamed, or one of a variadic parameter's
		}
		seeds = append(seeds, info.Defs[params[i]])
	}
	if len(seeds) == 0 {
		return false
	}
	sw := &sweeper{st: st, body: fd.Body, tainted: st.tainted(fd.Body, seeds...)}
	return sw.removes(nil) && sw.quietUses(fd.Body.List, false)
}

// sweeper judges the statements of one function that hold members read
// by a sweep (tainted).
type sweeper struct {
	st      *analysisState
	body    ast.Node // the function's body
	tainted map[types.Object]bool
	helper  *ast.CallExpr // a call of a helper that sweeps the members it is handed: quiet
	moved   *ast.CallExpr // the ZADD that puts them back at a new score (Access.Moves): quiet
}

// local reports a variable of the function's body, or an element of one:
// what is assigned to it stays in the function.
func (sw *sweeper) local(e ast.Expr) bool {
	if ix, ok := ast.Unparen(e).(*ast.IndexExpr); ok {
		e = ix.X
	}
	id, ok := ast.Unparen(e).(*ast.Ident)
	if !ok {
		return false
	}
	o := sw.st.pass.TypesInfo.ObjectOf(id)
	return id.Name == "_" || o != nil && o.Pos() >= sw.body.Pos() && o.Pos() < sw.body.End()
}

func (sw *sweeper) mentions(n ast.Node) bool { return mentionsAny(sw.st.pass.TypesInfo, sw.tainted, n) }

// removes reports a member going into removal rm, or into any removal of a
// sorted set in the body (one that rm sends, built for a pipeline; one of
// a helper's).
func (sw *sweeper) removes(rm ast.Node) bool {
	removed := false
	ast.Inspect(sw.body, func(m ast.Node) bool {
		if c, ok := m.(*ast.CallExpr); ok && !removed {
			removed = (c == rm || removeCmds[sw.st.chainCmd(c)]) && sw.mentions(c)
		}
		return !removed
	})
	return removed
}

// tainted returns seeds and every local given a value computed from them,
// or read from Redis with them, in body (a range's element variables, a
// pointer handed to a call of it: json.Unmarshal(raw, &v), a slice or map
// given such an element, a map keyed by them). An error, a
// count that a removal answered and a built rueidis command are no value
// of a member (what such a command sends is judged where it is built).
func (st *analysisState) tainted(body ast.Node, seeds ...types.Object) map[types.Object]bool {
	info := st.pass.TypesInfo
	tainted := map[types.Object]bool{}
	for _, o := range seeds {
		tainted[o] = true
	}
	uses := func(n ast.Node) bool { return mentionsAny(info, tainted, n) }
	for changed := true; changed; {
		changed = false
		mark := func(e ast.Expr) {
			if ix, ok := ast.Unparen(e).(*ast.IndexExpr); ok {
				e = ix.X // an element: the slice or map holds a member
			}
			id, ok := ast.Unparen(e).(*ast.Ident)
			if !ok || id.Name == "_" {
				return
			}
			o := info.ObjectOf(id)
			if o == nil || tainted[o] || isBuiltCmd(o.Type()) || isError(o.Type()) {
				return
			}
			tainted[o], changed = true, true
		}
		ast.Inspect(body, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.AssignStmt:
				for _, r := range x.Rhs {
					if uses(r) && !st.countOnly(r) {
						for _, l := range x.Lhs {
							mark(l)
						}
					}
				}
				for _, l := range x.Lhs {
					if ix, ok := ast.Unparen(l).(*ast.IndexExpr); ok && uses(ix.Index) {
						mark(ix.X) // a map keyed by members
					}
				}
			case *ast.RangeStmt:
				if uses(x.X) {
					mark(x.Key)
					mark(x.Value)
				}
			case *ast.ValueSpec:
				for _, v := range x.Values {
					if uses(v) {
						for _, n := range x.Names {
							mark(n)
						}
					}
				}
			case *ast.CallExpr:
				if uses(x) {
					for _, a := range x.Args {
						if u, ok := ast.Unparen(a).(*ast.UnaryExpr); ok && u.Op == token.AND {
							mark(u.X)
						}
					}
				}
			}
			return true
		})
	}
	return tainted
}

// countOnly reports an expression whose Redis commands all remove: what
// it answers is a count, no member.
func (st *analysisState) countOnly(e ast.Expr) bool {
	removes, reads := false, false
	ast.Inspect(e, func(m ast.Node) bool {
		if c, ok := m.(*ast.CallExpr); ok {
			if cmd, _ := st.redisCmd(c); cmd != "" {
				removes = removes || countCmds[cmd]
				reads = reads || !countCmds[cmd]
			}
		}
		return true
	})
	return removes && !reads
}

// mentionsAny reports whether n uses any of objs, but as the operand of
// len or cap: how many members there are is no member.
func mentionsAny(info *types.Info, objs map[types.Object]bool, n ast.Node) bool {
	found := false
	if n != nil {
		ast.Inspect(n, func(m ast.Node) bool {
			switch x := m.(type) {
			case *ast.CallExpr:
				if id, ok := ast.Unparen(x.Fun).(*ast.Ident); ok && len(x.Args) == 1 {
					if b, ok := info.Uses[id].(*types.Builtin); ok && (b.Name() == "len" || b.Name() == "cap") {
						if _, ok := ast.Unparen(x.Args[0]).(*ast.Ident); ok {
							return false
						}
					}
				}
			case *ast.Ident:
				if objs[info.Uses[x]] {
					found = true
				}
			}
			return !found
		})
	}
	return found
}

// isBuiltCmd reports a rueidis or valkey-go command built to be sent, or a
// slice of them.
func isBuiltCmd(t types.Type) bool {
	if sl, ok := t.Underlying().(*types.Slice); ok {
		t = sl.Elem()
	}
	named, ok := types.Unalias(t).(*types.Named)
	return ok && named.Obj().Pkg() != nil && isRueidis(named.Obj().Pkg().Path()) &&
		(named.Obj().Name() == "Completed" || named.Obj().Name() == "Cacheable")
}

// quietUses reports whether stmts use the members only in quiet
// statements; inRange: stmts are the body of a range over them, where
// every statement must be quiet, whatever it uses.
func (sw *sweeper) quietUses(stmts []ast.Stmt, inRange bool) bool {
	for _, s := range stmts {
		if !sw.quietUse(s, inRange) {
			return false
		}
	}
	return true
}

func (sw *sweeper) quietUse(s ast.Stmt, inRange bool) bool {
	header := func(n ast.Node) bool { // an if's, for's or range's expression
		return n == nil || !(inRange || sw.mentions(n)) || sw.quietNode(n)
	}
	switch x := s.(type) {
	case *ast.AssignStmt:
		if !(inRange || sw.mentions(x)) {
			return true
		}
		for _, l := range x.Lhs {
			if !sw.local(l) && slices.ContainsFunc(x.Rhs, func(r ast.Expr) bool { return sw.mentions(r) }) {
				return false // a member kept outside the function: handed on
			}
		}
		return sw.quietNode(x)
	case *ast.ExprStmt, *ast.IncDecStmt, *ast.DeclStmt:
		return !(inRange || sw.mentions(x)) || sw.quietNode(x)
	case *ast.BranchStmt:
		return x.Tok == token.CONTINUE || x.Tok == token.BREAK || !inRange
	case *ast.EmptyStmt:
		return true
	case *ast.BlockStmt:
		return sw.quietUses(x.List, inRange)
	case *ast.IfStmt:
		ok := (x.Init == nil || sw.quietUse(x.Init, inRange)) && header(x.Cond) &&
			sw.quietUses(x.Body.List, inRange)
		return ok && (x.Else == nil || sw.quietUse(x.Else, inRange))
	case *ast.RangeStmt:
		if sw.mentions(x.X) {
			return sw.quietNode(x.X) && sw.quietUses(x.Body.List, true)
		}
		return header(x.X) && sw.quietUses(x.Body.List, inRange)
	case *ast.ForStmt:
		ok := (x.Init == nil || sw.quietUse(x.Init, inRange)) && header(x.Cond) &&
			(x.Post == nil || sw.quietUse(x.Post, inRange))
		return ok && sw.quietUses(x.Body.List, inRange || sw.mentions(x.Cond))
	case *ast.ReturnStmt:
		if inRange {
			return false // a member taken: it acts
		}
		for _, r := range x.Results {
			if sw.mentions(r) && !(sw.st.countOnly(r) && sw.quietNode(r)) && ast.Unparen(r) != sw.helper {
				return false
			}
		}
		return true
	}
	return !(inRange || sw.mentions(s)) // go, defer, send, select, switch: they act
}

// quietNode reports whether every call in n is quiet.
func (sw *sweeper) quietNode(n ast.Node) bool {
	return quietWalk(n, func(c *ast.CallExpr) (quiet, descend bool) {
		if body, ok := sw.st.pipelinedBody(c); ok {
			// A go-redis pipeline's closure: its statements are judged
			// as the function's own.
			return sw.quietUses(body.List, false), false
		}
		return c == sw.helper || c == sw.moved || sw.st.quietCall(c, 0), true
	})
}

// quietWalk reports whether n holds no function literal, receives from no
// channel, and makes only calls that call finds quiet (descend false: call
// judged what the call holds too).
func quietWalk(n ast.Node, call func(*ast.CallExpr) (quiet, descend bool)) bool {
	quiet := true
	ast.Inspect(n, func(m ast.Node) bool {
		switch x := m.(type) {
		case *ast.CallExpr:
			q, descend := call(x)
			quiet = quiet && q
			if !descend {
				return false
			}
		case *ast.FuncLit:
			quiet = false
		case *ast.UnaryExpr:
			quiet = quiet && x.Op != token.ARROW
		}
		return quiet
	})
	return quiet
}

// pipelinedBody returns the body of the closure that a go-redis
// Pipelined or TxPipelined call (or an adapter's) runs its commands in.
func (st *analysisState) pipelinedBody(call *ast.CallExpr) (*ast.BlockStmt, bool) {
	fn, name := goRedisMethod(st.pass, call)
	if fn == nil || name != "Pipelined" && name != "TxPipelined" || len(call.Args) == 0 {
		return nil, false
	}
	fl, ok := ast.Unparen(call.Args[len(call.Args)-1]).(*ast.FuncLit)
	if !ok {
		return nil, false
	}
	return fl.Body, true
}

// quietCall reports a call that neither writes to Redis nor acts outside
// the program: see sweep.
func (st *analysisState) quietCall(call *ast.CallExpr, depth int) bool {
	info := st.pass.TypesInfo
	if tv, ok := info.Types[call.Fun]; ok && tv.IsType() {
		return true // a conversion
	}
	var obj types.Object
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		obj = info.Uses[f]
	case *ast.SelectorExpr:
		obj = info.Uses[f.Sel]
	}
	switch o := obj.(type) {
	case *types.Builtin:
		switch o.Name() {
		case "append", "len", "cap", "make", "copy", "min", "max", "new":
			return true
		}
	case *types.Func:
		if o.Pkg() == nil {
			return false
		}
		if cmd, client := st.redisCmd(call); client {
			return cmd == "" || countCmds[cmd] || readCmds[cmd]
		}
		path, name := o.Pkg().Path(), o.Name()
		switch {
		case quietPkgs[path] || isLogPkg(path):
			return true
		case path == "fmt":
			// Not Print: in a demo it stands for the work; nor Fprint: its
			// writer may hand a member on (a connection, a response).
			return strings.HasPrefix(name, "Sprint") || name == "Errorf"
		case o.Pkg() == st.pass.Pkg && depth < 3:
			return st.quietFunc(o, depth+1)
		}
	}
	return false
}

// chainCmd returns the command of the chain of calls that ends in call:
// rdb.ZRem(ctx, key, id).Result(), c.B().Zrem().Key(key).Member(id).Build().
func (st *analysisState) chainCmd(call *ast.CallExpr) string {
	for {
		if cmd, _ := st.redisCmd(call); cmd != "" {
			return cmd
		}
		sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
		if !ok {
			return ""
		}
		if call, ok = ast.Unparen(sel.X).(*ast.CallExpr); !ok {
			return ""
		}
	}
}

// redisCmd returns the command call sends or builds, upper case: a
// go-redis client method's (or one of its go-redis-like adapters'), a
// redigo or go-redis Do's or a radix action's by its constant name ("?"
// when it has none), a rueidis builder's; "" for another call of a client
// (a reply's method, a builder's argument, rueidis' Do). client reports a
// call of a Redis client's package.
func (st *analysisState) redisCmd(call *ast.CallExpr) (cmd string, client bool) {
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	o, ok := st.pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || o.Pkg() == nil {
		return "", false
	}
	path, name := o.Pkg().Path(), o.Name()
	recv := ""
	if named := recvNamed(o); named != nil {
		recv = named.Obj().Name()
	}
	named := func(i int) string {
		if len(call.Args) > i {
			if tv, ok := st.pass.TypesInfo.Types[call.Args[i]]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
				return strings.ToUpper(constant.StringVal(tv.Value))
			}
		}
		return "?"
	}
	switch {
	case isRedigo(path) || redigoShaped(o, st.pass.Pkg):
		switch {
		case recv == "Script" && name != "Load" && name != "Hash":
			return "?", true // a script: it may write anything
		case name == "Do" || name == "Send" || name == "DoContext" || name == "DoWithTimeout":
			// The command is the first string argument (after a context,
			// a timeout, or the connection of the package's functions).
			for i, a := range call.Args {
				if b, ok := st.pass.TypesInfo.TypeOf(a).(*types.Basic); ok && b.Info()&types.IsString != 0 {
					return named(i), true
				}
			}
			return "?", true
		}
		return "", true
	case isRadix(path):
		switch {
		case (name == "Cmd" || name == "FlatCmd") && recv == "":
			return named(1), true
		case recv == "EvalScript":
			return "?", true // a script: it may write anything
		}
		return "", true
	case sendsBuilt(o) || givesBuilder(o): // rueidis' and valkey-go's (not their adapters), or shaped like them
		switch recv {
		case "Builder":
			return strings.ToUpper(name), true
		case "Lua":
			return "?", true // a script: it may write anything
		}
		return "", true
	case isGoRedis(path) || isCompat(path) || goRedisShaped(o): // rueidis' and valkey-go's adapters are go-redis-like
		switch {
		case strings.HasSuffix(recv, "Cmd") || recv == "":
			return "", true
		case name == "Do":
			return named(1), true
		}
		return strings.ToUpper(name), true
	}
	return "", false
}

// quietFunc reports a function of this package whose body only makes
// quiet calls and returns what it computes (a key's name: return
// "trace:" + id; a log line of its own: log.Println("expired", id); a
// field read and parsed: v, err := rdb.HGet(...).Result(); if err != nil
// { return 0, err }; return strconv.Atoi(v)). Its statements are
// expressions, returns, assignments and declarations of its own locals,
// and ifs of them: it keeps nothing outside itself, starts nothing, and
// sends on no channel.
func (st *analysisState) quietFunc(fn *types.Func, depth int) bool {
	fd := st.decls[fn]
	if fd == nil || fd.Body == nil || len(fd.Body.List) == 0 {
		return false
	}
	local := func(e ast.Expr) bool {
		id, ok := ast.Unparen(e).(*ast.Ident)
		if !ok {
			return false
		}
		o := st.pass.TypesInfo.ObjectOf(id)
		return id.Name == "_" || o != nil && o.Pos() >= fd.Pos() && o.Pos() < fd.End()
	}
	var stmts func(list []ast.Stmt) bool
	stmt := func(s ast.Stmt) bool {
		switch x := s.(type) {
		case *ast.ExprStmt, *ast.ReturnStmt, *ast.DeclStmt:
		case *ast.AssignStmt:
			for _, l := range x.Lhs {
				if !local(l) {
					return false
				}
			}
		case *ast.BlockStmt:
			return stmts(x.List)
		case *ast.IfStmt:
			if !quietWalk(x.Cond, func(c *ast.CallExpr) (bool, bool) { return st.quietCall(c, depth), true }) {
				return false
			}
			var els []ast.Stmt
			if x.Else != nil {
				els = []ast.Stmt{x.Else}
			}
			return stmts([]ast.Stmt{x.Init}) && stmts(x.Body.List) && stmts(els)
		default:
			return false
		}
		return quietWalk(s, func(c *ast.CallExpr) (bool, bool) { return st.quietCall(c, depth), true })
	}
	stmts = func(list []ast.Stmt) bool {
		for _, s := range list {
			if s != nil && !stmt(s) {
				return false
			}
		}
		return true
	}
	return stmts(fd.Body.List)
}

// logPkgs are logging packages, by the last element of their path: a log
// line names a member, and hands it to no one.
var logPkgs = map[string]bool{
	"log": true, "slog": true, "glog": true, "klog": true, "logrus": true, "zerolog": true, "zap": true,
	"logger": true, "logging": true, "logr": true, "log15": true, "logx": true, "xlog": true, "go-hclog": true,
	"seelog": true,
}

// isLogPkg reports a logging package (the standard library's log and
// log/slog, the usual third-party ones, a project's own log or logger).
func isLogPkg(path string) bool {
	path = strings.TrimSuffix(path, "/v2")
	path = strings.TrimSuffix(path, "/v3")
	return logPkgs[path[strings.LastIndex(path, "/")+1:]]
}
