package zclaimvet

// Checks: whether the count a removal answers decides who runs the job.

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// countTested reports whether the count a removal returns is tested: its
// Val() in a condition, its Result()'s first value or a redigo reply
// helper's (redis.Int, redis.Bool) tested by a condition. Testing the
// error alone is no check.
func (st *analysisState) countTested(s *fnScope, call *ast.CallExpr) bool {
	pass := st.pass
	value := ast.Node(call)
	p := s.parent[call]
	// redigo: redis.Int(c.Do(...)), redis.Bool(...)
	if outer, ok := p.(*ast.CallExpr); ok && len(outer.Args) > 0 && outer.Args[0] == call {
		if sel, ok := outer.Fun.(*ast.SelectorExpr); ok {
			if fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func); ok && fn.Pkg() != nil && isRedigo(fn.Pkg().Path()) {
				value, p = outer, s.parent[outer]
			}
			if id, ok := sel.X.(*ast.Ident); ok {
				if pn, ok := pass.TypesInfo.Uses[id].(*types.PkgName); ok && isRedigo(pn.Imported().Path()) {
					value, p = outer, s.parent[outer]
				}
			}
		}
	}
	// go-redis: .Val(), .Result(); .Err() tests the error only.
	if sel, ok := p.(*ast.SelectorExpr); ok && sel.X == value {
		switch sel.Sel.Name {
		case "Err", "Error":
			return false
		case "Val", "Result", "Uint64", "Int64", "Bool", "AsInt64", "ToInt64", "AsBool", "ToBool":
			if c, ok := s.parent[sel].(*ast.CallExpr); ok {
				value, p = c, s.parent[c]
			}
		}
	}
	return st.valueTested(s, value, p)
}

// valueTested reports whether value (whose parent is p) is tested by a
// condition, directly or through the variable it is assigned to; a rueidis
// reply kept in a variable, through the count read from it.
func (st *analysisState) valueTested(s *fnScope, value, p ast.Node) bool {
	pass := st.pass
	if e, ok := value.(ast.Expr); ok && isError(pass.TypesInfo.TypeOf(e)) {
		return false // a wrapper that returns only the error
	}
	if inCondition(s, value) {
		return true
	}
	if as, ok := p.(*ast.AssignStmt); ok && len(as.Rhs) == 1 && len(as.Lhs) >= 1 {
		if id, ok := as.Lhs[0].(*ast.Ident); ok && id.Name != "_" {
			o := pass.TypesInfo.ObjectOf(id)
			if o != nil && isResult(o.Type()) {
				return st.resultTested(s, o)
			}
			return o != nil && !isError(o.Type()) && varTested(s, o, pass)
		}
	}
	return false
}

// resultTested reports whether the count read from rueidis reply o (its
// AsInt64, ToInt64, AsBool or ToBool) is tested.
func (st *analysisState) resultTested(s *fnScope, o types.Object) bool {
	tested := false
	ast.Inspect(s.body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || tested {
			return !tested
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		switch sel.Sel.Name {
		case "AsInt64", "ToInt64", "AsBool", "ToBool":
			if id, ok := sel.X.(*ast.Ident); ok && st.pass.TypesInfo.Uses[id] == o {
				tested = st.valueTested(s, call, s.parent[call])
			}
		}
		return true
	})
	return tested
}

// isError reports the error type: an error is no count.
func isError(t types.Type) bool {
	return t != nil && types.Identical(t, types.Universe.Lookup("error").Type())
}

// inCondition reports n within an if, for or switch condition, or a
// comparison.
func inCondition(s *fnScope, n ast.Node) bool {
	child := n
	for p := s.parent[n]; p != nil; child, p = p, s.parent[p] {
		switch x := p.(type) {
		case *ast.IfStmt:
			return x.Cond == child
		case *ast.ForStmt:
			return x.Cond == child
		case *ast.SwitchStmt:
			return x.Tag == child
		case *ast.BinaryExpr:
			switch x.Op {
			case token.EQL, token.NEQ, token.GTR, token.LSS, token.GEQ, token.LEQ, token.LAND, token.LOR:
				return true
			}
		case *ast.UnaryExpr:
			if x.Op == token.NOT {
				return true
			}
		case ast.Stmt:
			return false
		}
	}
	return false
}

func varTested(s *fnScope, o types.Object, pass *analysis.Pass) bool {
	tested := false
	ast.Inspect(s.body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && pass.TypesInfo.Uses[id] == o && inCondition(s, id) {
			tested = true
		}
		return !tested
	})
	return tested
}
