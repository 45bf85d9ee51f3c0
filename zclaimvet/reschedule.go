package zclaimvet

// Reschedules: a ZADD that puts a member the function read back on the
// key it was read from, at a new score, moves it out of the due range as
// a removal does. A poller of periodic jobs that reads what is due,
// runs each and ZADDs it at its next time lets a second worker, which read
// the member before that ZADD, run it again.

import (
	"go/ast"
	"go/token"
	"slices"
)

// zaddMethods are go-redis' ZADD methods that can move a member already
// there (not the NX ones, which only add): their members are Z values
// (ZAddArgs: its Members).
var zaddMethods = map[string]bool{"ZAdd": true, "ZAddXX": true, "ZAddGT": true, "ZAddLT": true,
	"ZAddCh": true, "ZAddXXCh": true, "ZAddArgs": true, "ZAddArgsIncr": true}

// zaddMembers returns the members that the arguments after the key of a
// go-redis ZADD method name: the Member of each Z literal (or of a
// pointer to one), and of those in a ZAddArgs literal's Members.
func zaddMembers(args []ast.Expr) []ast.Expr {
	var out []ast.Expr
	var visit func(e ast.Expr)
	visit = func(e ast.Expr) {
		e = ast.Unparen(e)
		if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
			e = ast.Unparen(u.X)
		}
		lit, ok := e.(*ast.CompositeLit)
		if !ok {
			return
		}
		for _, el := range lit.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				k, _ := kv.Key.(*ast.Ident)
				v, _ := ast.Unparen(kv.Value).(*ast.Ident)
				if k != nil && k.Name == "NX" && v != nil && v.Name == "true" {
					return // ZADD NX only adds
				}
			}
		}
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				visit(el) // an element of Members
				continue
			}
			switch k, _ := kv.Key.(*ast.Ident); {
			case k == nil:
			case k.Name == "Member":
				out = append(out, kv.Value)
			case k.Name == "Members":
				visit(kv.Value)
			}
		}
	}
	for _, a := range args {
		visit(a)
	}
	return out
}

// readMember tells where the members es name come from: read (one of
// them is a member this function read: an element or field of a due
// read's reply, through ranges, locals assigned once, indexes, type
// assertions and conversions), or else param, 1 + the index of the
// parameter one of them is, or ranges over (a helper that puts back what
// its caller read: whether it does is the caller's to tell), or 0.
func (st *analysisState) readMember(s *fnScope, es []ast.Expr) (read bool, param int) {
	read, _, param = st.readMemberOf(s, es)
	return read, param
}

// readMemberOf is readMember that also names the key the members were
// read from, where the read is one this function sends itself ("" for a
// read through a summary or rueidis, whose key it does not follow).
func (st *analysisState) readMemberOf(s *fnScope, es []ast.Expr) (read bool, key string, param int) {
	info := st.pass.TypesInfo
	readKey := ""
	var from func(e ast.Expr, depth int) (bool, int)
	from = func(e ast.Expr, depth int) (bool, int) {
		if depth > 6 {
			return false, 0
		}
		switch x := ast.Unparen(e).(type) {
		case *ast.Ident:
			o := info.ObjectOf(x)
			if i, ok := s.params[o]; ok && i >= 0 {
				return false, i + 1
			}
			if r, ok := s.ranged[o]; ok {
				return from(r, depth+1)
			}
			if d, ok := s.defs[o]; ok && !s.multi[o] {
				return from(d, depth+1)
			}
			if d, ok := s.tuple[o]; ok && len(s.values[o]) == 1 {
				return from(d, depth+1)
			}
		case *ast.SelectorExpr:
			return from(x.X, depth+1)
		case *ast.TypeAssertExpr:
			return from(x.X, depth+1)
		case *ast.IndexExpr:
			return from(x.X, depth+1)
		case *ast.SliceExpr:
			return from(x.X, depth+1)
		case *ast.StarExpr:
			return from(x.X, depth+1)
		case *ast.CallExpr:
			if tv, ok := info.Types[x.Fun]; ok && tv.IsType() && len(x.Args) == 1 {
				return from(x.Args[0], depth+1) // a conversion
			}
			if ev, ok := st.classify(s, x); ok {
				if ev.Read {
					readKey = ev.Key
				}
				return ev.Read, 0
			}
			if evs, _, ok := st.rueidisEvents(s, x, nil); ok {
				return slices.ContainsFunc(evs, func(e event) bool { return e.Read }), 0
			}
			// A function that reads due members (its summary): what it
			// returns is what it read.
			if fn := calleeOf(st.pass, x); fn != nil {
				if sum := st.summaryOf(fn); sum != nil && slices.ContainsFunc(sum.Accesses, func(a Access) bool { return a.Read }) {
					return true, 0
				}
			}
			// A reply's method (.Val(), .Result()), or a reply helper
			// (redigo's Strings) of the read.
			if sel, ok := ast.Unparen(x.Fun).(*ast.SelectorExpr); ok {
				if c, ok := ast.Unparen(sel.X).(*ast.CallExpr); ok {
					return from(c, depth+1)
				}
			}
			if len(x.Args) > 0 {
				if c, ok := ast.Unparen(x.Args[0]).(*ast.CallExpr); ok {
					return from(c, depth+1)
				}
			}
		}
		return false, 0
	}
	for _, e := range es {
		r, p := from(e, 0)
		if r {
			return true, readKey, 0
		}
		if param == 0 {
			param = p
		}
	}
	return false, "", param
}
