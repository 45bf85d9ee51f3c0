package zclaimvet

// radix (v3, v4): a command is an action, radix.Cmd(&rcv, "ZREM", key, id)
// or radix.FlatCmd(&rcv, "ZREM", key, ids), sent with a client's Do; its
// reply goes into rcv.

import (
	"go/ast"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// isRadix reports radix v3 and v4 (v3 also from its path before modules).
func isRadix(path string) bool {
	return path == "github.com/mediocregopher/radix" || strings.HasPrefix(path, "github.com/mediocregopher/radix/")
}

// radixCmd returns the arguments of a radix Cmd or FlatCmd from the
// command's name on, and the receiver of its reply.
func radixCmd(pass *analysis.Pass, call *ast.CallExpr) (args []ast.Expr, rcv ast.Expr, ok bool) {
	var id *ast.Ident
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.SelectorExpr:
		id = f.Sel
	case *ast.Ident:
		id = f
	default:
		return nil, nil, false
	}
	fn, ok := pass.TypesInfo.Uses[id].(*types.Func)
	if !ok || fn.Pkg() == nil || !isRadix(fn.Pkg().Path()) || fn.Name() != "Cmd" && fn.Name() != "FlatCmd" ||
		fn.Type().(*types.Signature).Recv() != nil || len(call.Args) < 2 {
		return nil, nil, false
	}
	return call.Args[1:], call.Args[0], true
}

// radixEvent reads the sorted-set command of a radix action. A read into
// a nil receiver reads no members; a ZREM of one member is checked when
// the variable its count is read into is tested.
func (st *analysisState) radixEvent(s *fnScope, call *ast.CallExpr) (event, bool) {
	args, rcv, ok := radixCmd(st.pass, call)
	if !ok {
		return event{}, false
	}
	ev, ok := st.doCommand(s, call, args)
	if !ok || ev.Read && isNil(st.pass, rcv) {
		return event{}, false
	}
	if !ev.Read && !ev.Score {
		ev.Checked = ev.Name == "ZREM" && !ev.Batch && !ev.Forward && st.rcvTested(s, rcv)
	}
	return ev, true
}

// rcvTested reports whether the variable a reply is read into (&n) is
// tested.
func (st *analysisState) rcvTested(s *fnScope, rcv ast.Expr) bool {
	u, ok := ast.Unparen(rcv).(*ast.UnaryExpr)
	if !ok {
		return false
	}
	id, ok := ast.Unparen(u.X).(*ast.Ident)
	if !ok {
		return false
	}
	o := st.pass.TypesInfo.ObjectOf(id)
	return o != nil && !isError(o.Type()) && varTested(s, o, st.pass)
}

func isNil(pass *analysis.Pass, e ast.Expr) bool {
	tv, ok := pass.TypesInfo.Types[e]
	return ok && tv.IsNil()
}
