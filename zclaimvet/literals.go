package zclaimvet

// Literals: where the function literals a function hands to a call run
// (beside it, as part of it, or later as pollers of their own).

import (
	"go/ast"
	"go/token"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// runLiterals returns the function literals that call hands to a runner
// to run on a goroutine: errgroup's and WaitGroup's Go and TryGo, a
// worker pool's Submit, time.AfterFunc.
func runLiterals(call *ast.CallExpr) []*ast.FuncLit {
	var name string
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.SelectorExpr:
		name = f.Sel.Name
	case *ast.Ident:
		name = f.Name
	}
	switch name {
	case "Go", "TryGo", "Submit", "AfterFunc":
	default:
		return nil
	}
	return funcLits(call)
}

// keptLiterals returns the function literals that composite literal or
// return statement n holds as values: kept to be called later.
func keptLiterals(n ast.Node) []*ast.FuncLit {
	var vals []ast.Expr
	switch x := n.(type) {
	case *ast.CompositeLit:
		for _, e := range x.Elts {
			if kv, ok := e.(*ast.KeyValueExpr); ok {
				e = kv.Value
			}
			vals = append(vals, e)
		}
	case *ast.ReturnStmt:
		vals = x.Results
	}
	var lits []*ast.FuncLit
	for _, v := range vals {
		if lit, ok := ast.Unparen(v).(*ast.FuncLit); ok {
			lits = append(lits, lit)
		}
	}
	return lits
}

// funcLits returns the function literals among call's arguments.
func funcLits(call *ast.CallExpr) []*ast.FuncLit {
	var lits []*ast.FuncLit
	for _, a := range call.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			lits = append(lits, lit)
		}
	}
	return lits
}

// inPlaceLiterals returns the function literals that call hands to a
// function that runs them before it returns, as part of the caller:
//   - a retry helper: retry-go's Do and DoWithData, backoff's Retry and its
//     variants, go-retry's Do;
//   - a function of this package whose body calls that parameter itself
//     (not on a goroutine, not from a literal of its own);
//   - a function whose code is not here (another module's, or one that did
//     not load), for a literal that assigns a variable of the caller's
//     (the caller reads what the literal left there once the call
//     returns, so the call ran it), or that returns values where the
//     caller takes the call's own (it hands back the literal's outcome):
//     a RunWithTimeout(ctx, func(ctx) error { ... }) wrapper, say.
//
// Not the literals of a go-redis Watch, Pipelined or TxPipelined call, nor
// those handed to a runner (runLiterals), which events reads as such.
func (st *analysisState) inPlaceLiterals(call *ast.CallExpr) []*ast.FuncLit {
	pass := st.pass
	lits := funcLits(call)
	if len(lits) == 0 || isWatch(pass, call) || runLiterals(call) != nil {
		return nil
	}
	if lit, _ := pipelined(pass, call); lit != nil {
		return nil
	}
	fun := ast.Unparen(call.Fun)
	switch f := fun.(type) { // a generic helper's instance: DoWithData[T]
	case *ast.IndexExpr:
		fun = f.X
	case *ast.IndexListExpr:
		fun = f.X
	}
	if retryHelper(pass, fun) {
		return lits
	}
	fn, _ := typeutil.Callee(pass.TypesInfo, call).(*types.Func)
	if fd := st.decls[fn]; fd != nil {
		return callsParams(pass, fd, call, lits)
	}
	if fn != nil && fn.Pkg() == pass.Pkg {
		return nil // an interface method or one without a body
	}
	var out []*ast.FuncLit
	for _, lit := range lits {
		if writesCallers(pass, lit) || st.taken[call] && lit.Type.Results != nil && len(lit.Type.Results.List) > 0 {
			out = append(out, lit)
		}
	}
	return out
}

// retryHelper reports whether fun names a retry helper's function.
func retryHelper(pass *analysis.Pass, fun ast.Expr) bool {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok {
		return false
	}
	pkg, ok := pass.TypesInfo.Uses[id].(*types.PkgName)
	if !ok {
		return false
	}
	path, name := pkg.Imported().Path(), sel.Sel.Name
	under := func(p string) bool { return path == p || strings.HasPrefix(path, p+"/") }
	return under("github.com/avast/retry-go") && (name == "Do" || name == "DoWithData") ||
		under("github.com/cenkalti/backoff") && strings.HasPrefix(name, "Retry") ||
		under("github.com/sethvargo/go-retry") && name == "Do"
}

// callsParams returns those of lits, the literals call hands to fd, whose
// parameter fd's body calls itself: not on a goroutine, nor from a literal
// of its own (kept, or run later).
func callsParams(pass *analysis.Pass, fd *ast.FuncDecl, call *ast.CallExpr, lits []*ast.FuncLit) []*ast.FuncLit {
	var params []*types.Var
	for _, f := range fd.Type.Params.List {
		for _, n := range f.Names {
			v, _ := pass.TypesInfo.Defs[n].(*types.Var)
			params = append(params, v)
		}
	}
	called := map[*types.Var]bool{}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncLit, *ast.GoStmt:
			return false
		case *ast.CallExpr:
			if id, ok := ast.Unparen(x.Fun).(*ast.Ident); ok {
				if v, ok := pass.TypesInfo.Uses[id].(*types.Var); ok {
					called[v] = true
				}
			}
		}
		return true
	})
	var out []*ast.FuncLit
	for i, a := range call.Args {
		lit, ok := ast.Unparen(a).(*ast.FuncLit)
		if !ok || !slices.Contains(lits, lit) || len(params) == 0 {
			continue
		}
		if p := params[min(i, len(params)-1)]; p != nil && called[p] {
			out = append(out, lit)
		}
	}
	return out
}

// writesCallers reports whether lit assigns a variable of the function it
// stands in: one declared outside it and not at package level.
func writesCallers(pass *analysis.Pass, lit *ast.FuncLit) bool {
	found := false
	ast.Inspect(lit.Body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || found || as.Tok != token.ASSIGN {
			return !found
		}
		for _, l := range as.Lhs {
			id, ok := ast.Unparen(l).(*ast.Ident)
			if !ok {
				continue
			}
			v, ok := pass.TypesInfo.Uses[id].(*types.Var)
			if ok && v.Pkg() != nil && v.Parent() != v.Pkg().Scope() && (v.Pos() < lit.Pos() || v.Pos() >= lit.End()) {
				found = true
			}
		}
		return !found
	})
	return found
}
