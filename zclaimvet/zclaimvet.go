// Package zclaimvet is a go/analysis analyzer that finds racy sorted-set
// pollers: a read of due members by score (ZRANGEBYSCORE, or ZRANGE ...
// BYSCORE) followed, in the same function, by a removal (ZREM,
// ZREMRANGEBYSCORE, ZREMRANGEBYRANK) on the same key, sent as separate
// requests, outside a Lua script or a WATCH transaction. Two pollers read
// the same member before either removes it, and the job runs twice.
//
// It knows go-redis (v9 and v8: the typed methods, ZRangeArgs with
// ByScore, and Do) and redigo's Do. A removal whose result decides who runs
// the job (a checked ZREM) is correct but costs a round trip per job: it
// gets a milder report of its own.
//
//	go install github.com/zclaim/zclaim/cmd/zclaimvet@latest
//	go vet -vettool=$(which zclaimvet) ./...
//
// A "//zclaimvet:ok" comment on the line of the read or the removal
// silences a report.
package zclaimvet

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Analyzer reports racy ZRANGEBYSCORE-then-ZREM pollers.
var Analyzer = &analysis.Analyzer{
	Name: "zclaimvet",
	Doc: "report sorted-set pollers that read due members by score and remove them in a separate request " +
		"(two workers take one job)",
	URL:      "https://pkg.go.dev/github.com/zclaim/zclaim/zclaimvet",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      run,
}

// Messages of the two reports.
const (
	RacyMessage = "racy poller: %s reads due members of %s and %s removes them in a separate request; " +
		"two workers read the same member before either removes it, and the job runs twice. " +
		"Claim in one script instead: zclaim's Broker.Claim, or its Dispatcher into asynq"
	CheckedMessage = "checked ZREM after %s on %s: correct (only the worker whose ZREM removed the member runs it), " +
		"but one round trip per job and every other worker's read wasted; zclaim's Broker.Claim " +
		"takes a batch in one script"
)

// op is a sorted-set call the analyzer cares about.
type op struct {
	call    *ast.CallExpr
	name    string   // the command, as Redis spells it
	key     ast.Expr // the key argument
	read    bool     // a read by score; else a removal
	checked bool     // a removal whose result is tested
}

var (
	readMethods = map[string]bool{"ZRangeByScore": true, "ZRangeByScoreWithScores": true, "ZRevRangeByScore": true,
		"ZRevRangeByScoreWithScores": true}
	argsMethods   = map[string]bool{"ZRangeArgs": true, "ZRangeArgsWithScores": true}
	removeMethods = map[string]string{"ZRem": "ZREM", "ZRemRangeByScore": "ZREMRANGEBYSCORE",
		"ZRemRangeByRank": "ZREMRANGEBYRANK"}
	removeCmds = map[string]bool{"ZREM": true, "ZREMRANGEBYSCORE": true, "ZREMRANGEBYRANK": true}
)

func run(pass *analysis.Pass) (any, error) {
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	ok := okLines(pass)
	// Functions run in a WATCH transaction are left out.
	watched := map[*ast.FuncLit]bool{}
	ins.Preorder([]ast.Node{(*ast.CallExpr)(nil)}, func(n ast.Node) {
		if call := n.(*ast.CallExpr); isWatch(pass, call) {
			for _, a := range call.Args {
				if lit, isLit := ast.Unparen(a).(*ast.FuncLit); isLit {
					watched[lit] = true
				}
			}
		}
	})
	ins.Preorder([]ast.Node{(*ast.FuncDecl)(nil), (*ast.FuncLit)(nil)}, func(n ast.Node) {
		var body *ast.BlockStmt
		switch f := n.(type) {
		case *ast.FuncDecl:
			body = f.Body
		case *ast.FuncLit:
			if watched[f] {
				return
			}
			body = f.Body
		}
		if body == nil {
			return
		}
		ops := collect(pass, body)
		// Each removal is reported once, against the last read of its key before it.
		for i, rm := range ops {
			if rm.read || ok[line(pass, rm.call)] {
				continue
			}
			for j := i - 1; j >= 0; j-- {
				r := ops[j]
				if !r.read || !sameKey(pass, r.key, rm.key) {
					continue
				}
				if ok[line(pass, r.call)] {
					break
				}
				key := render(pass, r.key)
				if rm.checked {
					pass.Reportf(rm.call.Pos(), CheckedMessage, r.name, key)
				} else {
					pass.Reportf(rm.call.Pos(), RacyMessage, r.name, key, rm.name)
				}
				break
			}
		}
	})
	return nil, nil
}

// collect returns the sorted-set calls of one function body in source
// order, leaving out nested function literals (each is a function of its
// own) and those passed to a WATCH transaction; a function that sends
// WATCH itself (redigo) has none.
func collect(pass *analysis.Pass, body *ast.BlockStmt) []op {
	var ops []op
	watches := false
	tested := testedCalls(pass, body)
	ast.Inspect(body, func(n ast.Node) bool {
		if _, lit := n.(*ast.FuncLit); lit {
			return false
		}
		call, isCall := n.(*ast.CallExpr)
		if !isCall {
			return true
		}
		if isWatch(pass, call) {
			return false // the WATCH transaction's function and keys
		}
		if sendsWatch(pass, call) {
			watches = true
		}
		if o, found := classify(pass, call); found {
			o.checked = !o.read && tested[call]
			ops = append(ops, o)
		}
		return true
	})
	if watches {
		return nil
	}
	return ops
}

// sendsWatch reports redigo's Do("WATCH", ...): the function reads and
// removes inside an optimistic transaction (WATCH, read, MULTI, ZREM, EXEC).
func sendsWatch(pass *analysis.Pass, call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Do" || len(call.Args) == 0 {
		return false
	}
	fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil || !isRedigo(fn.Pkg().Path()) {
		return false
	}
	cmd, ok := stringConst(pass, call.Args[0])
	return ok && strings.EqualFold(cmd, "WATCH")
}

// classify says whether call is a read by score or a removal, and of which key.
func classify(pass *analysis.Pass, call *ast.CallExpr) (op, bool) {
	sel, isSel := call.Fun.(*ast.SelectorExpr)
	if !isSel {
		return op{}, false
	}
	fn, isFunc := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !isFunc || fn.Pkg() == nil {
		return op{}, false
	}
	path := fn.Pkg().Path()
	name := sel.Sel.Name
	switch {
	case isGoRedis(path):
		switch {
		case readMethods[name] && len(call.Args) >= 2:
			return op{call: call, name: "ZRANGEBYSCORE", key: call.Args[1], read: true}, true
		case argsMethods[name] && len(call.Args) >= 2:
			if key, byScore := zrangeArgs(pass, call.Args[1]); byScore {
				return op{call: call, name: "ZRANGE BYSCORE", key: key, read: true}, true
			}
		case removeMethods[name] != "" && len(call.Args) >= 2:
			return op{call: call, name: removeMethods[name], key: call.Args[1]}, true
		case name == "Do" && len(call.Args) >= 3:
			return doCommand(pass, call, call.Args[1:])
		}
	case isRedigo(path) && name == "Do" && len(call.Args) >= 2:
		return doCommand(pass, call, call.Args)
	}
	return op{}, false
}

func isGoRedis(path string) bool {
	return strings.HasPrefix(path, "github.com/redis/go-redis/") || strings.HasPrefix(path, "github.com/go-redis/redis")
}

func isRedigo(path string) bool {
	return strings.HasPrefix(path, "github.com/gomodule/redigo/") ||
		strings.HasPrefix(path, "github.com/garyburd/redigo/")
}

// doCommand reads a command sent as Do(name, key, args...).
func doCommand(pass *analysis.Pass, call *ast.CallExpr, args []ast.Expr) (op, bool) {
	cmd, ok := stringConst(pass, args[0])
	if !ok || len(args) < 2 {
		return op{}, false
	}
	cmd = strings.ToUpper(cmd)
	switch {
	case cmd == "ZRANGEBYSCORE" || cmd == "ZREVRANGEBYSCORE":
		return op{call: call, name: cmd, key: args[1], read: true}, true
	case cmd == "ZRANGE":
		for _, a := range args[2:] {
			if s, ok := stringConst(pass, a); ok && strings.EqualFold(s, "BYSCORE") {
				return op{call: call, name: "ZRANGE BYSCORE", key: args[1], read: true}, true
			}
		}
	case removeCmds[cmd]:
		return op{call: call, name: cmd, key: args[1]}, true
	}
	return op{}, false
}

// zrangeArgs reads the Key of a ZRangeArgs literal and whether it has ByScore set.
func zrangeArgs(pass *analysis.Pass, e ast.Expr) (key ast.Expr, byScore bool) {
	lit, ok := ast.Unparen(e).(*ast.CompositeLit)
	if !ok {
		return nil, false
	}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		switch id, _ := kv.Key.(*ast.Ident); {
		case id == nil:
		case id.Name == "Key":
			key = kv.Value
		case id.Name == "ByScore":
			tv := pass.TypesInfo.Types[kv.Value]
			byScore = tv.Value == nil || constant.BoolVal(tv.Value) // a variable may be true
		}
	}
	return key, byScore && key != nil
}

func stringConst(pass *analysis.Pass, e ast.Expr) (string, bool) {
	tv, ok := pass.TypesInfo.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
		return "", false
	}
	return constant.StringVal(tv.Value), true
}

// isWatch reports a call of go-redis' Watch: its function runs in an
// optimistic transaction.
func isWatch(pass *analysis.Pass, call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil || !isGoRedis(fn.Pkg().Path()) {
		return false
	}
	return sel.Sel.Name == "Watch"
}

// sameKey reports whether two key expressions name the same key: the same
// variable (or field of the same variable), the same constant, or the same
// expression text.
func sameKey(pass *analysis.Pass, a, b ast.Expr) bool {
	a, b = ast.Unparen(a), ast.Unparen(b)
	if ca, ok := stringConst(pass, a); ok {
		cb, ok := stringConst(pass, b)
		return ok && ca == cb
	}
	if ia, ok := a.(*ast.Ident); ok {
		ib, ok := b.(*ast.Ident)
		return ok && pass.TypesInfo.ObjectOf(ia) != nil && pass.TypesInfo.ObjectOf(ia) == pass.TypesInfo.ObjectOf(ib)
	}
	return render(pass, a) == render(pass, b)
}

// testedCalls returns the calls whose result is tested: used in a
// condition, or assigned to a variable that a condition of the function
// uses.
func testedCalls(pass *analysis.Pass, body *ast.BlockStmt) map[*ast.CallExpr]bool {
	out := map[*ast.CallExpr]bool{}
	condVars := map[types.Object]bool{}
	var conds []ast.Expr
	ast.Inspect(body, func(n ast.Node) bool {
		switch s := n.(type) {
		case *ast.IfStmt:
			conds = append(conds, s.Cond)
		case *ast.SwitchStmt:
			if s.Tag != nil {
				conds = append(conds, s.Tag)
			}
		case *ast.CaseClause:
			conds = append(conds, s.List...)
		case *ast.ForStmt:
			if s.Cond != nil {
				conds = append(conds, s.Cond)
			}
		case *ast.BinaryExpr:
			switch s.Op {
			case token.EQL, token.NEQ, token.GTR, token.LSS, token.GEQ, token.LEQ:
				conds = append(conds, s)
			}
		}
		return true
	})
	for _, c := range conds {
		ast.Inspect(c, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.Ident:
				if o := pass.TypesInfo.ObjectOf(x); o != nil {
					condVars[o] = true
				}
			case *ast.CallExpr:
				markCalls(x, out)
			}
			return true
		})
	}
	ast.Inspect(body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Rhs) != 1 || len(as.Lhs) == 0 {
			return true
		}
		id, ok := as.Lhs[0].(*ast.Ident)
		if !ok || id.Name == "_" || !condVars[pass.TypesInfo.ObjectOf(id)] {
			return true
		}
		if call, ok := ast.Unparen(as.Rhs[0]).(*ast.CallExpr); ok {
			markCalls(call, out)
		}
		return true
	})
	return out
}

// markCalls marks call and the calls it chains on (ZRem(...).Result()).
func markCalls(call *ast.CallExpr, out map[*ast.CallExpr]bool) {
	for {
		out[call] = true
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return
		}
		inner, ok := ast.Unparen(sel.X).(*ast.CallExpr)
		if !ok {
			return
		}
		call = inner
	}
}

func render(pass *analysis.Pass, e ast.Expr) string {
	if s, ok := stringConst(pass, e); ok {
		return `"` + s + `"`
	}
	var b strings.Builder
	writeExpr(&b, e)
	return b.String()
}

// writeExpr writes a short form of e: enough to compare keys and to name
// one in a message.
func writeExpr(b *strings.Builder, e ast.Expr) {
	switch x := e.(type) {
	case *ast.Ident:
		b.WriteString(x.Name)
	case *ast.SelectorExpr:
		writeExpr(b, x.X)
		b.WriteString("." + x.Sel.Name)
	case *ast.BasicLit:
		b.WriteString(x.Value)
	case *ast.CallExpr:
		writeExpr(b, x.Fun)
		b.WriteString("(")
		for i, a := range x.Args {
			if i > 0 {
				b.WriteString(", ")
			}
			writeExpr(b, a)
		}
		b.WriteString(")")
	case *ast.BinaryExpr:
		writeExpr(b, x.X)
		b.WriteString(" " + x.Op.String() + " ")
		writeExpr(b, x.Y)
	case *ast.IndexExpr:
		writeExpr(b, x.X)
		b.WriteString("[")
		writeExpr(b, x.Index)
		b.WriteString("]")
	case *ast.StarExpr:
		b.WriteString("*")
		writeExpr(b, x.X)
	case *ast.ParenExpr:
		writeExpr(b, x.X)
	default:
		b.WriteString("?")
	}
}

func line(pass *analysis.Pass, n ast.Node) token.Position {
	p := pass.Fset.Position(n.Pos())
	return token.Position{Filename: p.Filename, Line: p.Line}
}

// okLines returns the lines that carry a "//zclaimvet:ok" comment.
func okLines(pass *analysis.Pass) map[token.Position]bool {
	out := map[token.Position]bool{}
	for _, f := range pass.Files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if strings.HasPrefix(c.Text, "//zclaimvet:ok") {
					p := pass.Fset.Position(c.Pos())
					out[token.Position{Filename: p.Filename, Line: p.Line}] = true
				}
			}
		}
	}
	return out
}
