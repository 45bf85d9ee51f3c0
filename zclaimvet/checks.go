package zclaimvet

// Checks: whether the count a removal answers decides who runs the job.

import (
	"go/ast"
	"go/token"
	"go/types"
	"slices"

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
	if o := st.kept(s, value, p); o != nil {
		return st.elementTested(s, o)
	}
	return st.replyTested(s, value, p)
}

// receivesTested reports, for a redigo Send of a removal, whether the
// replies its connection receives after it have their counts tested: each
// Receive() on the same connection after the Send in the function is
// tested as a Do's reply is (redis.Int(c.Receive()) in a condition), and
// there is one at least. A reply received untested (another command's,
// say) leaves the removal unchecked: which reply is whose is not followed.
func (st *analysisState) receivesTested(s *fnScope, send *ast.CallExpr) bool {
	sel, ok := send.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Send" {
		return false
	}
	conn := types.ExprString(sel.X)
	n, all := 0, true
	ast.Inspect(s.body, func(node ast.Node) bool {
		if !all { // one untested reply settles it
			return false
		}
		c, ok := node.(*ast.CallExpr)
		if !ok || c.Pos() <= send.End() || len(c.Args) != 0 {
			return true
		}
		if rs, ok := c.Fun.(*ast.SelectorExpr); ok && rs.Sel.Name == "Receive" && types.ExprString(rs.X) == conn {
			n++
			all = st.countTested(s, c)
		}
		return true
	})
	return n > 0 && all
}

// replyTested reports whether the count in reply value (whose parent is
// p) is tested: go-redis' .Val() or .Result(), rueidis' AsInt64 and the
// like, or the value itself; .Err() tests the error only.
func (st *analysisState) replyTested(s *fnScope, value, p ast.Node) bool {
	if sel, ok := p.(*ast.SelectorExpr); ok && sel.X == value {
		switch {
		case sel.Sel.Name == "Err" || sel.Sel.Name == "Error":
			return false
		case countMethods[sel.Sel.Name]:
			if c, ok := s.parent[sel].(*ast.CallExpr); ok {
				value, p = c, s.parent[c]
			}
		}
	}
	return st.valueTested(s, value, p)
}

// countMethods read the count out of a reply: go-redis' and rueidis'.
var countMethods = map[string]bool{"Val": true, "Result": true, "Uint64": true, "Int64": true, "Bool": true,
	"AsInt64": true, "ToInt64": true, "AsBool": true, "ToBool": true}

// countRead reports whether e, a reply, has its count read: e.Val(),
// e.Result(), e.AsInt64() and the like. Comparing the reply itself (with
// nil, say) reads no count.
func countRead(s *fnScope, e ast.Node) bool {
	sel, ok := s.parent[e].(*ast.SelectorExpr)
	return ok && sel.X == e && countMethods[sel.Sel.Name]
}

// kept returns the local slice or map that reply value (whose parent is
// p) is kept in, to be read once its pipeline has run: cmds[i] =
// pipe.ZRem(...), or cmds = append(cmds, pipe.ZRem(...)).
func (st *analysisState) kept(s *fnScope, value, p ast.Node) types.Object {
	info := st.pass.TypesInfo
	switch x := p.(type) {
	case *ast.AssignStmt:
		if len(x.Lhs) != 1 || len(x.Rhs) != 1 || x.Rhs[0] != value {
			break
		}
		if ix, ok := ast.Unparen(x.Lhs[0]).(*ast.IndexExpr); ok {
			if id, ok := ast.Unparen(ix.X).(*ast.Ident); ok {
				return info.ObjectOf(id)
			}
		}
	case *ast.CallExpr:
		f, ok := ast.Unparen(x.Fun).(*ast.Ident)
		e, eok := value.(ast.Expr)
		if !ok || !eok || f.Name != "append" || len(x.Args) < 2 || x.Ellipsis.IsValid() || !slices.Contains(x.Args[1:], e) {
			break
		}
		if _, ok := info.Uses[f].(*types.Builtin); !ok {
			break
		}
		if as, ok := s.parent[x].(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 && as.Rhs[0] == x {
			if id, ok := ast.Unparen(as.Lhs[0]).(*ast.Ident); ok {
				return info.ObjectOf(id)
			}
		}
	}
	return nil
}

// elementTested reports whether the count in an element of the local
// slice or map o is tested: one read by index (cmds[i].Val() == 1), or
// the value of a range over o (for _, c := range cmds { if c.Val() ...).
func (st *analysisState) elementTested(s *fnScope, o types.Object) bool {
	info := st.pass.TypesInfo
	tested := false
	ast.Inspect(s.body, func(n ast.Node) bool {
		if tested {
			return false
		}
		switch x := n.(type) {
		case *ast.IndexExpr:
			if id, ok := ast.Unparen(x.X).(*ast.Ident); ok && info.Uses[id] == o && countRead(s, x) {
				tested = st.replyTested(s, x, s.parent[x])
			}
		case *ast.RangeStmt:
			if id, ok := ast.Unparen(x.X).(*ast.Ident); ok && info.Uses[id] == o {
				tested = st.rangeTested(s, x)
			}
		}
		return true
	})
	return tested
}

// rangeTested reports whether the count in the value of range r, a reply
// of the slice or map it ranges over, is tested in its body.
func (st *analysisState) rangeTested(s *fnScope, r *ast.RangeStmt) bool {
	info := st.pass.TypesInfo
	v, ok := r.Value.(*ast.Ident)
	if !ok || v.Name == "_" {
		return false
	}
	vo := info.ObjectOf(v)
	tested := false
	ast.Inspect(r.Body, func(n ast.Node) bool {
		if u, ok := n.(*ast.Ident); ok && !tested && info.Uses[u] == vo && countRead(s, u) {
			tested = st.replyTested(s, u, s.parent[u])
		}
		return !tested
	})
	return tested
}

// repliesTested reports whether a count among the replies of call, which
// sends several commands and returns their replies in a slice (rueidis'
// DoMulti), is tested: an element of the local the slice is assigned to,
// of the call itself, or the value of a range over it.
func (st *analysisState) repliesTested(s *fnScope, call *ast.CallExpr) bool {
	switch p := s.parent[call].(type) {
	case *ast.AssignStmt:
		if len(p.Lhs) >= 1 && len(p.Rhs) == 1 && p.Rhs[0] == call {
			if id, ok := ast.Unparen(p.Lhs[0]).(*ast.Ident); ok && id.Name != "_" {
				return st.elementTested(s, st.pass.TypesInfo.ObjectOf(id))
			}
		}
	case *ast.RangeStmt:
		return p.X == call && st.rangeTested(s, p)
	case *ast.IndexExpr:
		return p.X == call && countRead(s, p) && st.replyTested(s, p, s.parent[p])
	}
	return false
}

// valueTested reports whether value (whose parent is p) is tested by a
// condition, directly or through the variable it is assigned to; a rueidis
// reply kept in a variable, through the count read from it.
func (st *analysisState) valueTested(s *fnScope, value, p ast.Node) bool {
	pass := st.pass
	if e, ok := value.(ast.Expr); ok && isError(pass.TypesInfo.TypeOf(e)) {
		return false // a wrapper that returns only the error
	}
	if inCondition(s, value) || returned(s, value) {
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

// returned reports n among the results of a return statement of the
// function itself, not of a closure within it: a wrapper that returns the
// count (return rdb.ZRem(...).Val(), or n after its error is tested)
// leaves the test to its callers, as one that returns the outcome of its
// own test does (see the Checked of a summary's access).
func returned(s *fnScope, n ast.Node) bool {
	r, ok := s.parent[n].(*ast.ReturnStmt)
	if !ok {
		return false
	}
	for p := s.parent[ast.Node(r)]; p != nil; p = s.parent[p] {
		if _, ok := p.(*ast.FuncLit); ok {
			return false
		}
	}
	return true
}

func varTested(s *fnScope, o types.Object, pass *analysis.Pass) bool {
	tested := false
	ast.Inspect(s.body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && pass.TypesInfo.Uses[id] == o && (inCondition(s, id) || returned(s, id)) {
			tested = true
		}
		return !tested
	})
	return tested
}

// ownGuard reports whether the tested count of removal call guards work
// the function does itself: the if statement that tests it leaves the
// function (or its loop) from its body, a statement after that if makes
// a call (the work), and the function returns no count or bool, so that its
// callers cannot be the ones who decide. A wrapper that returns the
// outcome (return n == 1, or a bool set from it) is left to its callers.
func (st *analysisState) ownGuard(s *fnScope, fd *ast.FuncDecl, call ast.Node) bool {
	if fd.Type.Results != nil {
		for _, f := range fd.Type.Results.List {
			t := st.pass.TypesInfo.TypeOf(f.Type)
			if b, ok := t.Underlying().(*types.Basic); ok && b.Info()&(types.IsBoolean|types.IsInteger) != 0 {
				return false
			}
		}
	}
	// The variable the count is kept in, if any.
	var kept types.Object
	n := ast.Node(call)
	for p := s.parent[n]; p != nil; n, p = p, s.parent[p] {
		if as, ok := p.(*ast.AssignStmt); ok {
			if id, ok := as.Lhs[0].(*ast.Ident); ok && id.Name != "_" {
				kept = st.pass.TypesInfo.ObjectOf(id)
			}
			break
		}
		if _, ok := p.(ast.Stmt); ok {
			break
		}
	}
	guard := false
	ast.Inspect(s.body, func(node ast.Node) bool {
		ifs, ok := node.(*ast.IfStmt)
		if !ok || guard {
			return !guard
		}
		uses := false
		ast.Inspect(ifs.Cond, func(c ast.Node) bool {
			switch x := c.(type) {
			case *ast.Ident:
				uses = uses || kept != nil && st.pass.TypesInfo.Uses[x] == kept
			case *ast.CallExpr:
				uses = uses || c == call
			}
			return !uses
		})
		if !uses || len(ifs.Body.List) == 0 {
			return true
		}
		switch ifs.Body.List[len(ifs.Body.List)-1].(type) {
		case *ast.ReturnStmt, *ast.BranchStmt:
		default:
			return true
		}
		block, ok := s.parent[ifs].(*ast.BlockStmt)
		if !ok {
			return true
		}
		for i, stmt := range block.List {
			if stmt != ifs {
				continue
			}
			for _, after := range block.List[i+1:] {
				ast.Inspect(after, func(c ast.Node) bool {
					_, call := c.(*ast.CallExpr)
					_, lit := c.(*ast.FuncLit)
					guard = guard || call
					return !guard && !lit
				})
			}
		}
		return true
	})
	return guard
}
