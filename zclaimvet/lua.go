package zclaimvet

// Scripts whose source is in the code (go-redis', redigo's, an EVAL sent by
// name): a script handed members that a read saw before it, which removes
// them from the key read without asking Redis first whether they are still
// there as the read saw them, removes them in a separate request as a plain
// ZREM would (a reaper that restores expired claims by a script that ZREMs
// them from the in-flight set and puts them back on the queue: two reapers
// both restore a member, the second after a worker took it again). Such a
// script call is a removal of those members. A script that reads the key
// itself (ZSCORE, ZRANGE, ZPOPMIN...), tests or keeps the reply of a
// removal, a pop or a SET (a gate, as a checked ZREM is in Go), or compares
// anything with what its caller passed (a compare-and-set) decides for
// itself, and is no removal. Where the source cannot be seen (EVALSHA, a
// script loaded from a file), a script is taken to decide.

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
)

var (
	// luaCall matches redis.call('CMD', KEY: the command and its first
	// argument (KEYS[n] or a local's name).
	luaCall = regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z]+)['"]\s*,\s*([A-Za-z_]\w*(?:\[\d+\])?)`)
	// luaAlias matches local name = KEYS[n], the whole of a statement.
	luaAlias = regexp.MustCompile(`(?m)local\s+([A-Za-z_]\w*)\s*=\s*KEYS\[(\d+)\]\s*(?:;|--.*)?$`)
	// luaBreak matches where a statement may begin on a line: after a
	// semicolon, or after then, do, else or end.
	luaBreak = regexp.MustCompile(`(?:;|\b(?:then|do|else|end)\b)\s*$`)
	// luaCAS matches a comparison with what the caller passed (an
	// argument, or a number made of one): a compare-and-set.
	luaCAS = regexp.MustCompile(`(?:==|~=|<=|>=|<|>)\s*(?:tonumber\(\s*)?ARGV\b|` +
		`tonumber\(\s*ARGV\[[^\]]*\]\s*\)\s*(?:==|~=|<=|>=|<|>)|ARGV\[[^\]]*\]\s*(?:==|~=|<=|>=|<|>)`)
	// luaReads are the commands by which a script reads a sorted set's
	// members, scores or ranks itself.
	luaReads = map[string]bool{"ZSCORE": true, "ZMSCORE": true, "ZRANK": true, "ZREVRANK": true, "ZRANGE": true,
		"ZRANGEBYSCORE": true, "ZREVRANGEBYSCORE": true, "ZREVRANGE": true, "ZPOPMIN": true, "ZPOPMAX": true,
		"ZRANGESTORE": true, "ZRANDMEMBER": true, "ZSCAN": true}
	// luaLookup matches a read of a record whose reply a script can
	// test (the command, and the key's text up to the next argument).
	luaLookup = regexp.MustCompile(`redis\.p?call\(\s*['"]((?i)get|hget|hgetall|hmget|exists|hexists)['"]\s*,\s*([^,)]+)`)
	// luaConsume matches a deletion of a record (the key's text as in
	// luaLookup).
	luaConsume = regexp.MustCompile(`redis\.p?call\(\s*['"]((?i)del|unlink|hdel)['"]\s*,\s*([^,)]+)`)
	// luaGates are the commands whose reply, where a script tests it or
	// keeps it, decides who goes on: a removal's count, a pop, a SET NX.
	luaGates = map[string]bool{"ZREM": true, "LREM": true, "SREM": true, "HDEL": true, "DEL": true, "UNLINK": true,
		"LPOP": true, "RPOP": true, "SPOP": true, "ZPOPMIN": true, "ZPOPMAX": true, "GETDEL": true, "SET": true,
		"SETNX": true, "HSETNX": true, "LMOVE": true, "RPOPLPUSH": true, "SMOVE": true}
)

// scriptRemoves returns the positions (from 0) among a script's keys of
// the sorted sets it removes members from without asking first: a ZREM
// that is a statement of its own (its reply read by nothing), of a key the
// script reads nothing of, in a script that compares nothing with its
// arguments and tests or keeps no reply of a removal, a pop or a SET (any
// of which decides who goes on, as a checked ZREM does in Go).
func scriptRemoves(src string) []int {
	if luaCAS.MatchString(src) || claimsRecord(src) {
		return nil
	}
	alias := map[string]int{}
	for _, m := range luaAlias.FindAllStringSubmatch(src, -1) {
		if n, err := strconv.Atoi(m[2]); err == nil {
			alias[m[1]] = n - 1
		}
	}
	keyOf := func(ref string) int {
		if strings.HasPrefix(ref, "KEYS[") {
			if n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(ref, "KEYS["), "]")); err == nil {
				return n - 1
			}
			return -1
		}
		if n, ok := alias[ref]; ok {
			return n
		}
		return -1
	}
	read, removed := map[int]bool{}, map[int]bool{}
	for _, at := range luaCall.FindAllStringSubmatchIndex(src, -1) {
		cmd, k := strings.ToUpper(src[at[2]:at[3]]), keyOf(src[at[4]:at[5]])
		alone := statementStart(src[:at[0]])
		if luaGates[cmd] && !alone {
			return nil // its reply decides
		}
		switch {
		case k < 0:
		case luaReads[cmd]:
			read[k] = true
		case cmd == "ZREM":
			removed[k] = true
		}
	}
	var out []int
	for k := range removed {
		if !read[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// claimsRecord reports whether a script claims by a record of another
// key: it reads the record, keeps or tests the reply (not a statement of
// its own), and deletes that same record. Inside one script that is a
// claim: the first run takes the record away, and a second finds none.
// A read that nothing deletes (an EXISTS of a job's record, say) decides
// nothing: two runs both find it.
func claimsRecord(src string) bool {
	consumed := map[string]bool{}
	for _, m := range luaConsume.FindAllStringSubmatch(src, -1) {
		consumed[strings.TrimSpace(m[2])] = true
	}
	for _, at := range luaLookup.FindAllStringSubmatchIndex(src, -1) {
		if consumed[strings.TrimSpace(src[at[4]:at[5]])] && !statementStart(src[:at[0]]) {
			return true
		}
	}
	return false
}

// scriptRemoval returns the removal that call, a script whose source is
// in the code (scriptSource), makes of members handed to it: of the keys
// scriptRemoves names, those the call's keys give as a literal. Its
// members must come from a read of this function (a plain removal), or
// from a parameter (MoveArg: a removal only where a caller hands it
// members it read); else the script removes nothing a read saw.
func (st *analysisState) scriptRemoval(s *fnScope, call *ast.CallExpr) (event, bool) {
	sc, ok := st.scriptCall(s, call)
	if !ok || len(sc.elts) == 0 {
		return event{}, false
	}
	src, ok := st.scriptSource(s, call)
	if !ok {
		return event{}, false
	}
	read, param := st.handed(s, sc.args)
	if !read && param == 0 {
		return event{}, false
	}
	for _, k := range scriptRemoves(src) {
		if k >= len(sc.elts) {
			continue
		}
		key := sc.elts[k]
		ev := event{Access: Access{Name: "ZREM in a script", Key: st.norm(s, key, 0), Pos: pos(st.pass, call),
			Shown: render(st.pass, key), Batch: true, MoveArg: param}, node: call}
		return ev, true
	}
	return event{}, false
}

// handed reports whether args carry members of a read of this function
// (read), or else the members of which of its parameters (param, from 1).
func (st *analysisState) handed(s *fnScope, args []ast.Expr) (read bool, param int) {
	if r, p := st.readMember(s, args); r || p > 0 {
		return r, p
	}
	info := st.pass.TypesInfo
	mentioned := func(seeds ...types.Object) bool {
		t := st.tainted(s.body, seeds...)
		for _, a := range args {
			if mentionsAny(info, t, a) {
				return true
			}
		}
		return false
	}
	// Locals given what a read answered, directly or by a reply's method.
	var reads []types.Object
	for o, d := range s.defs {
		if r, _ := st.readMember(s, []ast.Expr{d}); r {
			reads = append(reads, o)
		}
	}
	for o, d := range s.tuple {
		if r, _ := st.readMember(s, []ast.Expr{d}); r {
			reads = append(reads, o)
		}
	}
	if len(reads) > 0 && mentioned(reads...) {
		return true, 0
	}
	params := make([]types.Object, 0, len(s.params))
	for o, i := range s.params {
		if i >= 0 {
			params = append(params, o)
		}
	}
	slices.SortFunc(params, func(a, b types.Object) int { return s.params[a] - s.params[b] })
	for _, o := range params {
		if mentioned(o) {
			return false, s.params[o] + 1
		}
	}
	return false, 0
}

// scriptSource returns the source of the script call runs, where it is
// in the code: what sourceExpr finds, or what a function whose summary
// runs a script of its parameter (Runs.Src) is handed; a constant, or a
// variable given one.
func (st *analysisState) scriptSource(s *fnScope, call *ast.CallExpr) (string, bool) {
	if e := st.sourceExpr(s, call); e != nil {
		return st.constString(s, e, 0)
	}
	if fn := calleeOf(st.pass, call); fn != nil {
		if sum := st.summaryOf(fn); sum != nil && sum.Runs != nil && sum.Runs.Src > 0 && sum.Runs.Src <= len(call.Args) {
			return st.constString(s, call.Args[sum.Runs.Src-1], 0)
		}
	}
	return "", false
}

// sourceExpr returns the expression that gives the source of the script a
// go-redis or redigo call runs: the source argument of the NewScript that
// made the Script (through variables given it), a client's Eval's script,
// or an EVAL's sent by name; nil for none (EvalSha, a Script of unknown
// making).
func (st *analysisState) sourceExpr(s *fnScope, call *ast.CallExpr) ast.Expr {
	if na, ok := evalByName(st.pass, call); ok {
		return na[1]
	}
	if mk, _, ok := st.redigoScript(s, call); ok {
		return mk.Args[1]
	}
	if !st.goRedisScript(call) {
		return nil
	}
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	if fn := calleeOf(st.pass, call); fn == nil || recvNamed(fn) == nil || recvNamed(fn).Obj().Name() != "Script" {
		if name := sel.Sel.Name; name != "Eval" && name != "EvalRO" {
			return nil
		}
		for _, a := range call.Args {
			if b, ok := st.pass.TypesInfo.TypeOf(a).(*types.Basic); ok && b.Info()&types.IsString != 0 {
				return a
			}
		}
		return nil
	}
	if mk := st.newScriptCall(s, sel.X); mk != nil && len(mk.Args) == 1 {
		return mk.Args[0]
	}
	return nil
}

// newScriptCall returns the NewScript call (go-redis' or redigo's) that
// made the Script e is, through variables given it, or nil.
func (st *analysisState) newScriptCall(s *fnScope, e ast.Expr) *ast.CallExpr {
	for depth := 0; depth < 4; depth++ {
		switch x := ast.Unparen(e).(type) {
		case *ast.Ident:
			if e = st.valueOf(s, x); e == nil {
				return nil
			}
		case *ast.CallExpr:
			fn := calleeOf(st.pass, x)
			if fn == nil || fn.Name() != "NewScript" || fn.Pkg() == nil ||
				!isGoRedis(fn.Pkg().Path()) && !isRedigo(fn.Pkg().Path()) {
				return nil
			}
			return x
		default:
			return nil
		}
	}
	return nil
}

// constString returns the string e holds: a constant, or a local or
// package variable given one once.
func (st *analysisState) constString(s *fnScope, e ast.Expr, depth int) (string, bool) {
	if tv, ok := st.pass.TypesInfo.Types[e]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
		return constant.StringVal(tv.Value), true
	}
	if id, ok := ast.Unparen(e).(*ast.Ident); ok && depth <= 4 {
		if d := st.valueOf(s, id); d != nil {
			return st.constString(s, d, depth+1)
		}
	}
	return "", false
}

// valueOf returns what the variable id names was given: a local of s
// assigned once, or a package variable's initializer.
func (st *analysisState) valueOf(s *fnScope, id *ast.Ident) ast.Expr {
	o := st.pass.TypesInfo.ObjectOf(id)
	if o == nil {
		return nil
	}
	if d, ok := s.defs[o]; ok && !s.multi[o] {
		return d
	}
	v, ok := o.(*types.Var)
	if !ok || v.Parent() != st.pass.Pkg.Scope() {
		return nil
	}
	for _, f := range st.pass.Files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if st.pass.TypesInfo.Defs[n] == o && i < len(vs.Values) && len(vs.Names) == len(vs.Values) {
						return vs.Values[i]
					}
				}
			}
		}
	}
	return nil
}

// sourceParam returns the parameter (from 0) whose value is the source of
// the script call runs (sourceExpr), or -1.
func (st *analysisState) sourceParam(s *fnScope, call *ast.CallExpr) int {
	if id, ok := ast.Unparen(st.sourceExpr(s, call)).(*ast.Ident); ok {
		if i, ok := s.params[st.pass.TypesInfo.ObjectOf(id)]; ok {
			return i
		}
	}
	return -1
}

// statementStart reports whether what precedes a call on its line (before
// is the script up to the call) leaves the call a statement of its own:
// nothing, or a statement or block that ended (a semicolon, then, do,
// else, end) just before it.
func statementStart(before string) bool {
	line := before[strings.LastIndexByte(before, '\n')+1:]
	return strings.TrimSpace(line) == "" || luaBreak.MatchString(line)
}

// redigoScript returns, for a redigo Script's Do, DoContext, Send or
// SendHash, the NewScript call that made the Script (through variables
// given it) and the keys and arguments the call hands it.
func (st *analysisState) redigoScript(s *fnScope, call *ast.CallExpr) (mk *ast.CallExpr, keysAndArgs []ast.Expr, ok bool) {
	fn := calleeOf(st.pass, call)
	sel, isSel := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if fn == nil || fn.Pkg() == nil || !isRedigo(fn.Pkg().Path()) || !isSel {
		return nil, nil, false
	}
	if named := recvNamed(fn); named == nil || named.Obj().Name() != "Script" {
		return nil, nil, false
	}
	from := 1 // the connection
	switch fn.Name() {
	case "Do", "Send", "SendHash":
	case "DoContext":
		from = 2 // the context, then the connection
	default:
		return nil, nil, false
	}
	if len(call.Args) < from {
		return nil, nil, false
	}
	if mk := st.newScriptCall(s, sel.X); mk != nil && len(mk.Args) == 2 {
		return mk, call.Args[from:], true
	}
	return nil, nil, false
}

// constInt returns the int constant e is.
func constInt(pass *analysis.Pass, e ast.Expr) (int, bool) {
	if tv, ok := pass.TypesInfo.Types[e]; ok && tv.Value != nil && tv.Value.Kind() == constant.Int {
		if n, ok := constant.Int64Val(tv.Value); ok {
			return int(n), true
		}
	}
	return 0, false
}

// evalByName returns the arguments of an EVAL sent by name (redigo's Do or
// Send, radix's Cmd, GoFrame's Do), from the command's name on: the name,
// the script, the number of keys, the keys, the arguments.
func evalByName(pass *analysis.Pass, call *ast.CallExpr) ([]ast.Expr, bool) {
	if cmd, ok := namedCmd(pass, call); !ok || cmd != "EVAL" {
		return nil, false
	}
	na, _ := namedArgs(pass, call)
	return na, len(na) >= 3
}
