package zclaimvet

// Commands: which sorted-set command or claim a call sends, for
// go-redis' typed methods and Do, and commands sent by name (redigo's Do
// and Send, radix's Cmd and FlatCmd).

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"math"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// goRedisMethod returns the go-redis function call calls, and its name.
func goRedisMethod(pass *analysis.Pass, call *ast.CallExpr) (*types.Func, string) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil, ""
	}
	fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil || !isGoRedis(fn.Pkg().Path()) && !isCompat(fn.Pkg().Path()) && !goRedisShaped(fn) {
		return nil, ""
	}
	return fn, sel.Sel.Name
}

// goRedisShaped reports a method of an interface that a project declares
// over go-redis' client (ZRangeByScore(ctx, key, opt) *redis.StringSliceCmd
// and the like): its first result is of go-redis' types. Its calls are
// read as the client's.
func goRedisShaped(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil || !types.IsInterface(sig.Recv().Type()) || sig.Results().Len() == 0 {
		return false
	}
	t := types.Unalias(sig.Results().At(0).Type())
	switch u := t.(type) {
	case *types.Pointer:
		t = types.Unalias(u.Elem())
	case *types.Slice:
		t = types.Unalias(u.Elem())
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && isGoRedis(n.Obj().Pkg().Path())
}

var (
	readMethods = map[string]bool{"ZRangeByScore": true, "ZRangeByScoreWithScores": true, "ZRevRangeByScore": true,
		"ZRevRangeByScoreWithScores": true}
	rankReadMethods = map[string]bool{"ZRangeWithScores": true, "ZRevRangeWithScores": true}
	argsMethods     = map[string]bool{"ZRangeArgs": true, "ZRangeArgsWithScores": true}
	removeMethods   = map[string]string{"ZRem": "ZREM", "ZRemRangeByScore": "ZREMRANGEBYSCORE",
		"ZRemRangeByRank": "ZREMRANGEBYRANK"}
	removeCmds  = map[string]bool{"ZREM": true, "ZREMRANGEBYSCORE": true, "ZREMRANGEBYRANK": true}
	claimMethod = map[string]bool{"LPop": true, "RPop": true, "RPopLPush": true, "LMove": true, "BLMove": true,
		"BRPopLPush": true, "BLPop": true, "BRPop": true, "SetNX": true, "HSetNX": true, "LMPop": true, "BLMPop": true}
	claimCmds = map[string]bool{"LPOP": true, "RPOP": true, "RPOPLPUSH": true, "LMOVE": true, "BLMOVE": true,
		"BRPOPLPUSH": true, "BLPOP": true, "BRPOP": true, "SETNX": true, "HSETNX": true, "LMPOP": true, "BLMPOP": true}
	// lockNames are the claims that take a lock, by the upper-case
	// command or method name.
	lockNames = map[string]string{"SETNX": "SETNX", "HSETNX": "HSETNX"}
)

// addCmds are the commands that add a member to a set and answer whether
// they added it: where the caller tests that count, only one caller of
// a member goes on (addClaim).
var addCmds = map[string]bool{"ZADD": true, "SADD": true}

// addClaim tells whether call adds one member to a set and its caller
// tests the count (a ZADD NX or SADD of the id into a "taken" set, say):
// the caller whose add counted 1 goes on, as with a SET NX.
func (st *analysisState) addClaim(s *fnScope, call *ast.CallExpr) bool {
	name := ""
	if fn, n := goRedisMethod(st.pass, call); fn != nil {
		switch n {
		case "ZAdd", "ZAddNX", "SAdd":
			name = n
		case "Do":
			if i := keyIndex(fn); i < len(call.Args) {
				if cmd, ok := stringConst(st.pass, call.Args[i]); ok && addCmds[strings.ToUpper(cmd)] {
					name = cmd
				}
			}
		}
	} else if cmd, ok := namedCmd(st.pass, call); ok && addCmds[cmd] {
		name = cmd
	}
	return name != "" && st.countTested(s, call)
}

// claimOf tells whether a command hands an id to one caller only (claim):
// a pop or move from a list, or a SET NX, which is also a lock: the name
// it is reported by, "" for any other claim.
func claimOf(pass *analysis.Pass, call *ast.CallExpr) (claim bool, lock string) {
	if lock := libraryLock(pass, call); lock != "" {
		return true, lock
	}
	if fn, _ := goFrameMethod(pass, call); fn != nil && claimMethod[fn.Name()] {
		return true, lockNames[strings.ToUpper(fn.Name())]
	}
	if fn, name := goRedisMethod(pass, call); fn != nil {
		if claimMethod[name] {
			return true, lockNames[strings.ToUpper(name)]
		}
		if name == "SetArgs" {
			for _, a := range call.Args {
				if lit, ok := ast.Unparen(a).(*ast.CompositeLit); ok {
					for _, el := range lit.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok {
							if v, ok := stringConst(pass, kv.Value); ok && strings.EqualFold(v, "NX") {
								return true, "SET NX"
							}
						}
					}
				}
			}
		}
		if name == "Do" {
			return doClaim(pass, call.Args[min(keyIndex(fn), len(call.Args)):])
		}
		return false, ""
	}
	if cmd, ok := namedCmd(pass, call); ok {
		if claimCmds[cmd] {
			return true, lockNames[cmd]
		}
		if cmd == "SET" {
			args, _ := namedArgs(pass, call)
			return doClaim(pass, args)
		}
	}
	return false, ""
}

// mutexLocks are the methods of redsync's Mutex that take its lock.
var mutexLocks = map[string]bool{"Lock": true, "LockContext": true, "TryLock": true, "TryLockContext": true}

// libraryLock returns the name a call of a distributed-lock library is
// reported by when it takes a lock, a key in Redis that expires as a SET
// NX's does: Lock, LockContext, TryLock and TryLockContext of redsync's
// Mutex (go-redsync/redsync, and hjr265/redsync.go before it) and
// redislock's Obtain (bsm/redislock), or "".
func libraryLock(pass *analysis.Pass, call *ast.CallExpr) string {
	fn := calleeOf(pass, call)
	if fn == nil || fn.Pkg() == nil {
		return ""
	}
	path, name := fn.Pkg().Path(), fn.Name()
	switch {
	case strings.HasPrefix(path, "github.com/go-redsync/redsync") || strings.HasPrefix(path, "github.com/hjr265/redsync.go/"):
		if r := recvNamed(fn); r != nil && r.Obj().Name() == "Mutex" && mutexLocks[name] {
			return "redsync " + name
		}
	case strings.HasPrefix(path, "github.com/bsm/redislock"):
		if name == "Obtain" {
			return "redislock Obtain"
		}
	}
	return ""
}

func doClaim(pass *analysis.Pass, args []ast.Expr) (claim bool, lock string) {
	if len(args) == 0 {
		return false, ""
	}
	cmd, ok := stringConst(pass, args[0])
	if !ok {
		return false, ""
	}
	cmd = strings.ToUpper(cmd)
	if claimCmds[cmd] {
		return true, lockNames[cmd]
	}
	if cmd == "SET" {
		for _, a := range args[1:] {
			if v, ok := stringConst(pass, a); ok && strings.EqualFold(v, "NX") {
				return true, "SET NX"
			}
		}
	}
	return false, ""
}

// namedCmd returns the command of a redigo Do or Send, or of a radix Cmd
// or FlatCmd.
func namedCmd(pass *analysis.Pass, call *ast.CallExpr) (string, bool) {
	args, ok := namedArgs(pass, call)
	if !ok {
		return "", false
	}
	cmd, ok := stringConst(pass, args[0])
	return strings.ToUpper(cmd), ok
}

// namedArgs returns the arguments, from the command's name on, of a
// command sent by name: redigo's Do or Send, GoFrame's Do, radix's Cmd or
// FlatCmd.
func namedArgs(pass *analysis.Pass, call *ast.CallExpr) ([]ast.Expr, bool) {
	if isRedigoSend(pass, call) {
		return call.Args, true
	}
	if args, ok := goFrameDo(pass, call); ok {
		return args, true
	}
	args, _, ok := radixCmd(pass, call)
	return args, ok
}

func importsRedigo(p *types.Package) bool {
	for _, imp := range p.Imports() {
		if isRedigo(imp.Path()) {
			return true
		}
	}
	return false
}

// keyIndex is where the key is among the arguments of a go-redis method:
// after the context (v8, v9), or first (v7 and older).
func keyIndex(fn *types.Func) int {
	sig := fn.Type().(*types.Signature)
	if sig.Params().Len() > 0 {
		if named, ok := sig.Params().At(0).Type().(*types.Named); ok && named.Obj().Name() == "Context" {
			return 1
		}
	}
	return 0
}

// classify reads a sorted-set command sent by call itself.
func (st *analysisState) classify(s *fnScope, call *ast.CallExpr) (event, bool) {
	pass := st.pass
	mk := func(name string, key ast.Expr, read bool) event {
		return event{Access: Access{Read: read, Name: name, Key: st.norm(s, key, 0), Pos: pos(pass, call),
			Shown: render(pass, key)}, node: call}
	}
	if fn, name := goRedisMethod(pass, call); fn != nil {
		k := keyIndex(fn)
		if len(call.Args) <= k {
			return event{}, false
		}
		switch {
		case readMethods[name]:
			ev := mk("ZRANGEBYSCORE", call.Args[k], true)
			if len(call.Args) > k+1 {
				opt := st.literalOf(s, call.Args[k+1])
				ev.Fixed = oneScore(pass, field(opt, "Min"), field(opt, "Max"))
				ev.Lookup, ev.LookupArg = st.lookup(s, ev.Fixed, field(opt, "Min"), field(opt, "Max"))
			}
			return ev, true
		case rankReadMethods[name]:
			ev := mk("ZRANGE WITHSCORES", call.Args[k], true)
			if len(call.Args) > k+1 {
				start, ok := scoreConst(pass, call.Args[k+1])
				ev.Page = !ok || start != 0
			}
			return ev, true
		case name == "ZRange" || name == "ZRevRange":
			ev := mk(strings.ToUpper(name), call.Args[k], true)
			ev.Rank = true
			ev.Head = len(call.Args) > k+2 && headOnly(pass, call.Args[k+1], call.Args[k+2])
			return ev, true
		case name == "ZScore":
			ev := mk("ZSCORE", call.Args[k], false)
			ev.Score = true
			return ev, true
		case argsMethods[name]:
			lit := st.literalOf(s, call.Args[k])
			if key, byScore := st.zrangeArgs(lit); key != nil && (byScore || name == "ZRangeArgsWithScores") {
				n := "ZRANGE BYSCORE"
				if !byScore {
					n = "ZRANGE WITHSCORES"
				}
				ev := mk(n, key, true)
				ev.Fixed = byScore && oneScore(pass, field(lit, "Start"), field(lit, "Stop"))
				ev.Lookup, ev.LookupArg = st.lookup(s, ev.Fixed || !byScore, field(lit, "Start"), field(lit, "Stop"))
				return ev, true
			}
		case zaddMethods[name]:
			noFlags := func(string) bool { return false } // the NX methods are not among them
			return st.zsetCommand(s, call, "ZADD", call.Args[k], noFlags, zaddMembers(call.Args[k+1:]), false)
		case removeMethods[name] != "":
			ev := mk(removeMethods[name], call.Args[k], false)
			st.removal(s, &ev, call, name == "ZRem", call.Args[k+1:], call.Ellipsis.IsValid())
			return ev, true
		case name == "Do" && len(call.Args) >= k+2:
			return st.doCommand(s, call, call.Args[k:])
		}
		return event{}, false
	}
	if isRedigoSend(pass, call) {
		return st.doCommand(s, call, call.Args)
	}
	if ev, ok := st.goFrameEvent(s, call); ok {
		return ev, true
	}
	return st.radixEvent(s, call)
}

// isRedigoSend reports a redigo Do or Send, whatever its command; where
// the connection's type did not resolve (the package does not fully
// type-check), a Do or Send in a package that imports redigo.
func isRedigoSend(pass *analysis.Pass, call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Do" && sel.Sel.Name != "Send" || len(call.Args) == 0 {
		return false
	}
	fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	return ok && fn.Pkg() != nil && (isRedigo(fn.Pkg().Path()) || redigoShaped(fn, pass.Pkg)) ||
		pass.TypesInfo.Uses[sel.Sel] == nil && importsRedigo(pass.Pkg)
}

// redigoShaped reports a method of an interface that a project declares
// over redigo's connection: Do(cmd string, args ...interface{})
// (interface{}, error), or Send(cmd string, args ...interface{}) error,
// where the package declaring it, or pkg (the one calling it), imports
// redigo.
func redigoShaped(fn *types.Func, pkg *types.Package) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil || !types.IsInterface(sig.Recv().Type()) || !sig.Variadic() || sig.Params().Len() != 2 {
		return false
	}
	if fn.Pkg() == nil || !importsRedigo(fn.Pkg()) && !importsRedigo(pkg) {
		return false
	}
	if args, ok := sig.Params().At(1).Type().(*types.Slice); !ok || !types.IsInterface(args.Elem()) {
		return false
	}
	name, ok := sig.Params().At(0).Type().Underlying().(*types.Basic)
	if !ok || name.Kind() != types.String {
		return false
	}
	res := sig.Results()
	switch fn.Name() {
	case "Do":
		return res.Len() == 2 && types.IsInterface(res.At(0).Type()) && isError(res.At(1).Type())
	case "Send":
		return res.Len() == 1 && isError(res.At(0).Type())
	}
	return false
}

// doCommand reads a command sent as Do(name, key, args...).
func (st *analysisState) doCommand(s *fnScope, call *ast.CallExpr, args []ast.Expr) (event, bool) {
	if len(args) < 2 {
		return event{}, false
	}
	spread := call.Ellipsis.IsValid()
	if len(args) == 2 && spread {
		if rest, more, ok := st.argsBuilt(s, args[1]); ok && len(rest) > 0 {
			args, spread = append([]ast.Expr{args[0]}, rest...), more
		} else if rest, more, ok := st.sliceBuilt(s, args[1], call.Pos(), 0); ok && len(rest) > 0 {
			args, spread = append([]ast.Expr{args[0]}, rest...), more
		}
	}
	for _, cmd := range st.constStrings(s, args[0]) {
		if ev, ok := st.doCommandNamed(s, call, strings.ToUpper(cmd), args, spread); ok {
			return ev, true
		}
	}
	return event{}, false
}

// argsBuilt returns the arguments a redigo redis.Args holds, sent spread
// (c.Do("ZREM", redis.Args{}.Add(key).Add(id)...)): its literal's elements
// and those of each Add, through a local assigned once. An AddFlat after
// the key adds members (more: a slice's elements); an AddFlat before it
// (a struct's fields: no key to read) reports false, as does anything else.
func (st *analysisState) argsBuilt(s *fnScope, e ast.Expr) (args []ast.Expr, more, ok bool) {
	pass := st.pass
	e = ast.Unparen(e)
	if id, ok := e.(*ast.Ident); ok {
		d, ok := s.defs[pass.TypesInfo.ObjectOf(id)]
		if !ok {
			return nil, false, false
		}
		e = ast.Unparen(d)
	}
	named, ok := pass.TypesInfo.TypeOf(e).(*types.Named)
	if !ok || named.Obj().Name() != "Args" || named.Obj().Pkg() == nil || !isRedigo(named.Obj().Pkg().Path()) {
		return nil, false, false
	}
	switch x := e.(type) {
	case *ast.CompositeLit:
		return slices.Clone(x.Elts), false, true
	case *ast.CallExpr:
		sel, ok := x.Fun.(*ast.SelectorExpr)
		if !ok || x.Ellipsis.IsValid() || sel.Sel.Name != "Add" && sel.Sel.Name != "AddFlat" {
			return nil, false, false
		}
		base, more, ok := st.argsBuilt(s, sel.X)
		if sel.Sel.Name == "AddFlat" {
			return base, true, ok && len(base) > 0
		}
		return append(base, x.Args...), more, ok
	}
	return nil, false, false
}

// sliceBuilt returns the arguments a local slice holds when it is sent
// spread at pos (c.Do("ZREM", args...)), as the last value it was given
// before pos builds it: a literal ([]interface{}{key, id}), an empty slice
// (make([]interface{}, 0, n), or declared without a value), or an append to
// a literal or to the slice itself (args = append(args, ids...)), whose
// first element is the key. more reports members beyond those returned (an
// append of a spread slice or of the slice itself, which a loop may
// repeat). It reports false for anything else.
func (st *analysisState) sliceBuilt(s *fnScope, e ast.Expr, pos token.Pos, depth int) (args []ast.Expr, more, ok bool) {
	pass := st.pass
	if depth > 8 {
		return nil, false, false
	}
	id, isID := ast.Unparen(e).(*ast.Ident)
	if !isID {
		return st.sliceValue(s, e, nil, depth) // sent as it is built: c.Do("ZREM", append(...)...)
	}
	o := pass.TypesInfo.ObjectOf(id)
	if _, param := s.params[o]; param || o == nil {
		return nil, false, false
	}
	var last ast.Expr
	for _, v := range s.values[o] {
		if v == nil || v.Pos() >= pos {
			continue
		}
		if last == nil || v.Pos() > last.Pos() {
			last = v
		}
	}
	if last == nil {
		if d, ok := s.defs[o]; ok && d.Pos() < pos {
			last = d
		}
	}
	if last == nil {
		_, isSlice := o.Type().Underlying().(*types.Slice)
		// var args []interface{}: empty until appended to.
		return nil, false, isSlice && !slices.Contains(s.values[o], nil) && st.declaredEmpty(s, o)
	}
	return st.sliceValue(s, last, o, depth)
}

// sliceValue reads v, a value given to local o (nil: an expression sent as
// it is built), as sliceBuilt does: a slice literal, an empty make, or an
// append to a literal or to o itself (an expression sent as it is built
// may append to any local).
func (st *analysisState) sliceValue(s *fnScope, v ast.Expr, o types.Object, depth int) (args []ast.Expr, more, ok bool) {
	pass := st.pass
	v = ast.Unparen(v)
	t := pass.TypesInfo.TypeOf(v)
	if t == nil {
		return nil, false, false
	}
	if _, isSlice := t.Underlying().(*types.Slice); !isSlice {
		return nil, false, false
	}
	switch x := v.(type) {
	case *ast.CompositeLit:
		return slices.Clone(x.Elts), false, true
	case *ast.CallExpr:
		fn, ok := ast.Unparen(x.Fun).(*ast.Ident)
		b, builtin := pass.TypesInfo.Uses[fn].(*types.Builtin)
		if !ok || !builtin || len(x.Args) < 2 {
			return nil, false, false
		}
		if b.Name() == "make" {
			// make([]interface{}, 0, n): empty.
			tv := pass.TypesInfo.Types[x.Args[1]]
			return nil, false, tv.Value != nil && constant.Sign(tv.Value) == 0
		}
		if b.Name() != "append" {
			return nil, false, false
		}
		var base []ast.Expr
		switch b := ast.Unparen(x.Args[0]).(type) {
		case *ast.CompositeLit:
			base = slices.Clone(b.Elts)
		case *ast.Ident:
			if o != nil && pass.TypesInfo.ObjectOf(b) != o {
				return nil, false, false
			}
			var bmore bool
			base, bmore, ok = st.sliceBuilt(s, b, x.Pos(), depth+1)
			if !ok {
				return nil, false, false
			}
			more = bmore || o != nil // appended to itself: a loop may repeat it
		default:
			return nil, false, false
		}
		return append(base, x.Args[1:]...), more || x.Ellipsis.IsValid(), true
	}
	return nil, false, false
}

// declaredEmpty reports a local declared by a var statement of the
// function without a value.
func (st *analysisState) declaredEmpty(s *fnScope, o types.Object) bool {
	found := false
	ast.Inspect(s.body, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Values) == 0 {
			found = found || slices.ContainsFunc(vs.Names, func(id *ast.Ident) bool { return st.pass.TypesInfo.Defs[id] == o })
		}
		return !found
	})
	return found
}

// doCommandNamed reads command cmd sent with args (args[0] the command;
// spread: the last of them is spread).
func (st *analysisState) doCommandNamed(s *fnScope, call *ast.CallExpr, cmd string, args []ast.Expr, spread bool) (event, bool) {
	has := func(flag string) bool {
		for _, a := range args[2:] {
			if v, ok := stringConst(st.pass, a); ok && strings.EqualFold(v, flag) {
				return true
			}
		}
		return false
	}
	ev, ok := st.zsetCommand(s, call, cmd, args[1], has, args[2:], spread)
	byScore := ev.Name == "ZRANGEBYSCORE" || ev.Name == "ZREVRANGEBYSCORE" || ev.Name == "ZRANGE BYSCORE"
	if ok && ev.Read && byScore && len(args) >= 4 {
		ev.Fixed = oneScore(st.pass, args[2], args[3]) // min max, or max min
		ev.Lookup, ev.LookupArg = st.lookup(s, ev.Fixed, args[2], args[3])
	}
	return ev, ok
}

// field returns the value of field name in literal lit, or nil.
func field(lit *ast.CompositeLit, name string) ast.Expr {
	if lit == nil {
		return nil
	}
	for _, el := range lit.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok && id.Name == name {
				return kv.Value
			}
		}
	}
	return nil
}

// headOnly reports rank bounds 0 and 0: the first member alone.
func headOnly(pass *analysis.Pass, start, stop ast.Expr) bool {
	a, ok1 := scoreConst(pass, start)
	b, ok2 := scoreConst(pass, stop)
	return ok1 && ok2 && a == 0 && b == 0
}

// oneScore reports score bounds that are one constant finite number ("0"
// and 0, "5" and "5.0"): a range of one fixed score, which stays where it
// is whatever the time. "+inf", an exclusive bound and anything not
// constant may take in what comes due.
func oneScore(pass *analysis.Pass, lo, hi ast.Expr) bool {
	a, ok1 := scoreConst(pass, lo)
	b, ok2 := scoreConst(pass, hi)
	return ok1 && ok2 && a == b
}

// scoreConst returns the value of a constant finite score bound.
func scoreConst(pass *analysis.Pass, e ast.Expr) (float64, bool) {
	if e == nil {
		return 0, false
	}
	tv, ok := pass.TypesInfo.Types[e]
	if !ok || tv.Value == nil {
		return 0, false
	}
	switch tv.Value.Kind() {
	case constant.Int, constant.Float:
		f, _ := constant.Float64Val(tv.Value)
		return f, true
	case constant.String:
		f, err := strconv.ParseFloat(constant.StringVal(tv.Value), 64)
		return f, err == nil && !math.IsInf(f, 0)
	}
	return 0, false
}

// zsetCommand is the access that sorted-set command cmd (upper case) on key
// makes, sent by call: has tells whether it carries a flag (BYSCORE,
// WITHSCORES); members are a removal's members (spread: the last of them
// is spread).
func (st *analysisState) zsetCommand(s *fnScope, call *ast.CallExpr, cmd string, key ast.Expr, has func(string) bool,
	members []ast.Expr, spread bool) (event, bool) {
	pass := st.pass
	mk := func(name string, read bool) event {
		return event{Access: Access{Read: read, Name: name, Key: st.norm(s, key, 0), Pos: pos(pass, call),
			Shown: render(pass, key)}, node: call}
	}
	switch {
	case cmd == "ZRANGEBYSCORE" || cmd == "ZREVRANGEBYSCORE":
		return mk(cmd, true), true
	case cmd == "ZRANGE" || cmd == "ZREVRANGE":
		switch {
		case has("BYSCORE"):
			return mk("ZRANGE BYSCORE", true), true
		case has("WITHSCORES"):
			return mk("ZRANGE WITHSCORES", true), true
		}
		ev := mk(cmd, true)
		ev.Rank = true
		ev.Head = len(members) >= 2 && headOnly(pass, members[0], members[1])
		return ev, true
	case cmd == "ZSCORE":
		ev := mk(cmd, false)
		ev.Score = true
		return ev, true
	case removeCmds[cmd]:
		ev := mk(cmd, false)
		st.removal(s, &ev, call, cmd == "ZREM", members, spread)
		return ev, true
	case cmd == "ZADD" && !has("NX"): // ZADD NX only adds
		read, from, param := st.readMemberOf(s, members)
		if !read && param == 0 {
			return event{}, false
		}
		ev := mk(cmd, false)
		if read && from != "" && from != ev.Key {
			return event{}, false // a member read from another key: put there, not moved on this one
		}
		ev.Moves, ev.MoveArg = true, param
		return ev, true
	}
	return event{}, false
}

// removal fills in how many members a removal takes and whether its count
// is tested.
func (st *analysisState) removal(s *fnScope, ev *event, call *ast.CallExpr, zrem bool, members []ast.Expr,
	ellipsis bool) {
	single := zrem && len(members) == 1 && !ellipsis && !isSlice(st.pass, members[0])
	if zrem && ellipsis && len(members) == 1 {
		if id, ok := ast.Unparen(members[0]).(*ast.Ident); ok {
			if i, ok := s.params[st.pass.TypesInfo.ObjectOf(id)]; ok && i >= 0 {
				ev.Forward = true
			}
		}
	}
	ev.Batch = !single && !ev.Forward
	if single {
		ev.member = members[0]
	}
	ev.Checked = single && (st.countTested(s, call) || st.receivesTested(s, call))
	ev.picked = single && st.picked(s, call, members[0])
	ev.Exact = ev.Name == "ZREMRANGEBYSCORE" && len(members) == 2 && !ellipsis && st.sameScore(members[0], members[1])
}

// lookup reports read bounds lo and hi (of a read not fixed) that are one
// score (sameScore) which the clock does not give: a lookup of what sits
// at a score the caller names; arg is 1 + the index of the parameter the
// score is made from, for the caller to judge, or 0. A poll of the
// current second (ZRANGEBYSCORE key now now) reads what came due.
func (st *analysisState) lookup(s *fnScope, fixed bool, lo, hi ast.Expr) (lookup bool, arg int) {
	if fixed || lo == nil || hi == nil || !st.sameScore(lo, hi) || st.fromClock(s, lo, 0) {
		return false, 0
	}
	return true, st.paramOf(s, lo, 0)
}

// paramOf returns 1 + the index of the one parameter expression e is made
// from (directly, or through locals assigned once), or 0.
func (st *analysisState) paramOf(s *fnScope, e ast.Expr, depth int) int {
	found := map[int]bool{}
	var walk func(e ast.Expr, depth int)
	walk = func(e ast.Expr, depth int) {
		if depth > 6 {
			return
		}
		ast.Inspect(e, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			o := st.pass.TypesInfo.ObjectOf(id)
			if i, ok := s.params[o]; ok && i >= 0 {
				found[i] = true
			} else if d, ok := s.defs[o]; ok && !s.multi[o] {
				walk(d, depth+1)
			}
			return true
		})
	}
	walk(e, depth)
	if len(found) != 1 {
		return 0
	}
	for i := range found {
		return i + 1
	}
	return 0
}

// fromClock reports an expression that calls time.Now, directly or
// through the locals it is built from.
func (st *analysisState) fromClock(s *fnScope, e ast.Expr, depth int) bool {
	if depth > 6 || e == nil {
		return false
	}
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if found {
			return false
		}
		switch x := n.(type) {
		case *ast.CallExpr:
			if fn := calleeOf(st.pass, x); fn != nil && fn.Pkg() != nil && fn.Pkg().Path() == "time" && fn.Name() == "Now" {
				found = true
			}
		case *ast.Ident:
			o := st.pass.TypesInfo.ObjectOf(x)
			if d, ok := s.defs[o]; ok && !s.multi[o] {
				found = st.fromClock(s, d, depth+1)
			}
		}
		return !found
	})
	return found
}

// sameScore reports two score bounds that are one score: the same
// expression, or equal constants.
func (st *analysisState) sameScore(lo, hi ast.Expr) bool {
	if a, ok := scoreConst(st.pass, lo); ok {
		b, ok := scoreConst(st.pass, hi)
		return ok && a == b
	}
	return types.ExprString(lo) == types.ExprString(hi) && isPure(lo)
}

// isPure reports an expression of names, fields and constants only: two
// of them with the same text have the same value.
func isPure(e ast.Expr) bool {
	switch x := ast.Unparen(e).(type) {
	case *ast.Ident, *ast.BasicLit:
		return true
	case *ast.SelectorExpr:
		return isPure(x.X)
	}
	return false
}

// picked reports a removal (call) of one member m that the function's
// caller named: a parameter of the function, or a member read that the
// removal stands under a test of equality with a parameter (a console's
// kill finds the job the user picked in its listing, then moves it). It
// removes one member its caller chose, not the members a read found due.
func (st *analysisState) picked(s *fnScope, call *ast.CallExpr, m ast.Expr) bool {
	info := st.pass.TypesInfo
	param := func(e ast.Expr) bool {
		if c, ok := ast.Unparen(e).(*ast.CallExpr); ok && len(c.Args) == 1 { // string(id), []byte(id)
			if tv, ok := info.Types[c.Fun]; ok && tv.IsType() {
				e = c.Args[0]
			}
		}
		id, ok := ast.Unparen(e).(*ast.Ident)
		if !ok {
			return false
		}
		o := info.ObjectOf(id)
		i, isParam := s.params[o]
		return isParam && i >= 0 && !s.multi[o]
	}
	if param(m) {
		return true
	}
	shown := types.ExprString(ast.Unparen(m))
	child := ast.Node(call)
	for p := s.parent[call]; p != nil; child, p = p, s.parent[p] {
		if _, ok := p.(*ast.FuncLit); ok {
			return false
		}
		ifs, ok := p.(*ast.IfStmt)
		if !ok || ifs.Body != child {
			continue
		}
		if b, ok := ast.Unparen(ifs.Cond).(*ast.BinaryExpr); ok && b.Op == token.EQL {
			x, y := ast.Unparen(b.X), ast.Unparen(b.Y)
			if types.ExprString(x) == shown && param(y) || types.ExprString(y) == shown && param(x) {
				return true
			}
		}
	}
	return false
}

// isSlice reports a slice or array of members; a []byte (a payload kept
// as the member, say) is one member, as every client sends it.
func isSlice(pass *analysis.Pass, e ast.Expr) bool {
	t := pass.TypesInfo.TypeOf(e)
	if t == nil {
		return false
	}
	switch u := t.Underlying().(type) {
	case *types.Slice:
		b, ok := u.Elem().Underlying().(*types.Basic)
		return !ok || b.Kind() != types.Byte
	case *types.Array:
		return true
	}
	return false
}

// zrangeArgs reads the Key of a ZRangeArgs literal (literalOf) and
// whether it has ByScore set.
func (st *analysisState) zrangeArgs(lit *ast.CompositeLit) (key ast.Expr, byScore bool) {
	if lit == nil {
		return nil, false
	}
	if v := field(lit, "ByScore"); v != nil {
		tv := st.pass.TypesInfo.Types[v]
		byScore = tv.Value == nil || constant.BoolVal(tv.Value) // a variable may be true
	}
	return field(lit, "Key"), byScore
}

// literalOf returns the composite literal e is or points to, also through
// a local assigned once; nil for anything else.
func (st *analysisState) literalOf(s *fnScope, e ast.Expr) *ast.CompositeLit {
	e = ast.Unparen(e)
	if id, ok := e.(*ast.Ident); ok {
		if d, ok := s.defs[st.pass.TypesInfo.ObjectOf(id)]; ok {
			e = ast.Unparen(d)
		}
	}
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = ast.Unparen(u.X)
	}
	lit, _ := e.(*ast.CompositeLit)
	return lit
}
