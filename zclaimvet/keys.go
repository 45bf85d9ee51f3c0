package zclaimvet

// Keys: what a command's key argument is, normalized so that two
// functions' keys compare (a parameter, the receiver's field, a constant,
// a call of them), and how a message shows it.

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// fnScope is what one function's keys are normalized against.
type fnScope struct {
	params map[types.Object]int
	recv   types.Object
	defs   map[types.Object]ast.Expr   // locals assigned once
	multi  map[types.Object]bool       // locals assigned more than once
	values map[types.Object][]ast.Expr // every value a local is given
	parent map[ast.Node]ast.Node
	body   *ast.BlockStmt
	ranged map[types.Object]ast.Expr // the variables of range statements: what they range over
	tuple  map[types.Object]ast.Expr // locals defined from a call of several results (ids, err := ...)
}

func (st *analysisState) scope(fd *ast.FuncDecl) *fnScope {
	s := &fnScope{params: map[types.Object]int{}, defs: map[types.Object]ast.Expr{}, multi: map[types.Object]bool{},
		values: map[types.Object][]ast.Expr{},
		parent: map[ast.Node]ast.Node{}, body: fd.Body, ranged: map[types.Object]ast.Expr{},
		tuple: map[types.Object]ast.Expr{}}
	info := st.pass.TypesInfo
	if fd.Recv != nil && len(fd.Recv.List) == 1 && len(fd.Recv.List[0].Names) == 1 {
		s.recv = info.Defs[fd.Recv.List[0].Names[0]]
	}
	i := 0
	for _, f := range fd.Type.Params.List {
		if len(f.Names) == 0 {
			i++
		}
		for _, n := range f.Names {
			s.params[info.Defs[n]] = i
			i++
		}
	}
	var stack []ast.Node
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		if len(stack) > 0 {
			s.parent[n] = stack[len(stack)-1]
		}
		stack = append(stack, n)
		switch x := n.(type) {
		case *ast.AssignStmt:
			for j, l := range x.Lhs {
				id, ok := l.(*ast.Ident)
				if !ok || id.Name == "_" {
					continue
				}
				o := info.ObjectOf(id)
				if len(x.Rhs) == 1 && len(x.Lhs) > 1 && x.Tok == token.DEFINE {
					s.tuple[o] = x.Rhs[0]
				}
				if len(x.Lhs) == len(x.Rhs) && (x.Tok == token.DEFINE || x.Tok == token.ASSIGN) {
					s.values[o] = append(s.values[o], x.Rhs[j])
				} else {
					s.values[o] = append(s.values[o], nil)
				}
				_, seen := s.defs[o]
				if seen || x.Tok != token.DEFINE || len(x.Lhs) != len(x.Rhs) {
					s.multi[o] = true
					continue
				}
				s.defs[o] = x.Rhs[j]
			}
		case *ast.ValueSpec:
			for j, n := range x.Names {
				if j < len(x.Values) {
					s.defs[info.Defs[n]] = x.Values[j]
				}
			}
		case *ast.IncDecStmt:
			if id, ok := x.X.(*ast.Ident); ok {
				s.multi[info.ObjectOf(id)] = true
			}
		case *ast.RangeStmt:
			for _, e := range []ast.Expr{x.Key, x.Value} {
				if id, ok := e.(*ast.Ident); ok && x.Tok == token.DEFINE {
					s.ranged[info.Defs[id]] = x.X
				}
			}
		}
		return true
	})
	return s
}

// norm writes a key expression in a form two expressions of the same key
// share: constants quoted, parameters as ⟨pN⟩, the receiver as ⟨r⟩, a
// local assigned once as what it was assigned, package variables by name,
// other locals by their declaration (never equal to a parameter's form).
func (st *analysisState) norm(s *fnScope, e ast.Expr, depth int) string {
	pass := st.pass
	if c, ok := stringConst(pass, e); ok {
		return strconv.Quote(c)
	}
	if depth > 6 {
		return "⟨? " + strconv.Itoa(int(e.Pos())) + "⟩"
	}
	switch x := ast.Unparen(e).(type) {
	case *ast.Ident:
		o := pass.TypesInfo.ObjectOf(x)
		if o == nil {
			return "⟨?" + x.Name + "⟩"
		}
		if i, ok := s.params[o]; ok {
			return "⟨p" + strconv.Itoa(i) + "⟩"
		}
		if o == s.recv && o != nil {
			return "⟨r⟩"
		}
		if d, ok := s.defs[o]; ok && !s.multi[o] {
			return st.norm(s, d, depth+1)
		}
		if o.Pkg() != nil && o.Parent() == o.Pkg().Scope() {
			return "⟨g " + o.Pkg().Path() + "." + o.Name() + "⟩"
		}
		return "⟨l " + x.Name + "@" + strconv.Itoa(int(o.Pos())) + "⟩"
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			if pn, ok := pass.TypesInfo.Uses[id].(*types.PkgName); ok {
				return pn.Imported().Path() + "." + x.Sel.Name
			}
		}
		return st.norm(s, x.X, depth+1) + "." + x.Sel.Name
	case *ast.CallExpr:
		if tv, ok := pass.TypesInfo.Types[x.Fun]; ok && tv.IsType() && len(x.Args) == 1 {
			return st.norm(s, x.Args[0], depth+1) // a conversion: string(key) is key
		}
		var b strings.Builder
		b.WriteString(st.norm(s, x.Fun, depth+1) + "(")
		for i, a := range x.Args {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(st.norm(s, a, depth+1))
		}
		return b.String() + ")"
	case *ast.BinaryExpr:
		return st.norm(s, x.X, depth+1) + " " + x.Op.String() + " " + st.norm(s, x.Y, depth+1)
	case *ast.IndexExpr:
		return st.norm(s, x.X, depth+1) + "[" + st.norm(s, x.Index, depth+1) + "]"
	case *ast.StarExpr:
		return st.norm(s, x.X, depth+1)
	case *ast.UnaryExpr:
		if x.Op == token.AND {
			return st.norm(s, x.X, depth+1)
		}
	case *ast.BasicLit:
		return x.Value
	}
	return "⟨? " + strconv.Itoa(int(e.Pos())) + "⟩"
}

// local reports a normalized key that names something only this function
// knows: it cannot be handed to a caller.
func local(key string) bool {
	return strings.Contains(key, "⟨l ") || strings.Contains(key, "⟨?")
}

// constStrings returns the constant strings e can hold: its value, or
// every value a local it names is given, if all are constants.
func (st *analysisState) constStrings(s *fnScope, e ast.Expr) []string {
	if v, ok := stringConst(st.pass, e); ok {
		return []string{v}
	}
	id, ok := ast.Unparen(e).(*ast.Ident)
	if !ok {
		return nil
	}
	vals := s.values[st.pass.TypesInfo.ObjectOf(id)]
	var out []string
	for _, v := range vals {
		c, ok := stringConst(st.pass, v)
		if v == nil || !ok {
			return nil
		}
		out = append(out, c)
	}
	return out
}

func stringConst(pass *analysis.Pass, e ast.Expr) (string, bool) {
	tv, ok := pass.TypesInfo.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
		return "", false
	}
	return constant.StringVal(tv.Value), true
}

// substitute writes a callee's key in the caller's terms, in one pass:
// the caller's arguments hold placeholders of the caller's own.
func substitute(key string, args []string, recv string) (string, bool) {
	ok := true
	out := placeholder.ReplaceAllStringFunc(key, func(m string) string {
		if m == "⟨r⟩" {
			return recv
		}
		idx := strings.TrimSuffix(m[len("⟨p"):len(m)-len("⟩")], "[0]")
		i, err := strconv.Atoi(idx)
		if err != nil || i >= len(args) {
			ok = false
			return m
		}
		if strings.HasSuffix(m, "[0]⟩") && strings.HasSuffix(args[i], "...") {
			// The caller spreads its own variadic parameter.
			return strings.TrimSuffix(args[i], "⟩...") + "[0]⟩"
		}
		return args[i]
	})
	return out, ok
}

var placeholder = regexp.MustCompile(`⟨p\d+(\[0\])?⟩|⟨r⟩`)

func render(pass *analysis.Pass, e ast.Expr) string {
	if s, ok := stringConst(pass, e); ok {
		return strconv.Quote(s)
	}
	var b strings.Builder
	writeExpr(&b, e)
	return b.String()
}

// writeExpr writes a short form of e, to name a key in a message.
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
	case *ast.UnaryExpr:
		b.WriteString(x.Op.String())
		writeExpr(b, x.X)
	case *ast.ParenExpr:
		writeExpr(b, x.X)
	default:
		b.WriteString("…")
	}
}

// display turns a normalized key into something a reader recognizes.
func display(key string) string {
	r := strings.NewReplacer("⟨r⟩.", "", "⟨r⟩", "the receiver")
	out := r.Replace(key)
	for strings.Contains(out, "⟨") {
		i := strings.Index(out, "⟨")
		j := strings.Index(out[i:], "⟩")
		if j < 0 {
			break
		}
		inner := out[i+len("⟨") : i+j]
		name := "key"
		switch {
		case strings.HasPrefix(inner, "p"):
			name = "the key argument"
			if n, err := strconv.Atoi(inner[1:]); err == nil {
				name = fmt.Sprintf("argument %d", n+1)
			}
		case strings.HasPrefix(inner, "l "), strings.HasPrefix(inner, "g "):
			name = strings.SplitN(inner[2:], "@", 2)[0]
			if k := strings.LastIndex(name, "."); k >= 0 {
				name = name[k+1:]
			}
		}
		out = out[:i] + name + out[i+j+len("⟩"):]
	}
	return out
}

// sameKey reports whether a read of key a and a removal of key b in one
// function name one sorted set: the same key, or keys made by one
// fmt.Sprintf format whose arguments differ where one of them is not a
// constant (a read of fmt.Sprintf(f, "default") and a removal of
// fmt.Sprintf(f, job.Queue), the queue of a job that read found). Two
// constants that differ name two sets.
func sameKey(a, b string) bool {
	if a == b {
		return true
	}
	const sprintf = "fmt.Sprintf("
	if !strings.HasPrefix(a, sprintf) || !strings.HasPrefix(b, sprintf) || !strings.HasSuffix(a, ")") || !strings.HasSuffix(b, ")") {
		return false
	}
	as, bs := splitArgs(a[len(sprintf):len(a)-1]), splitArgs(b[len(sprintf):len(b)-1])
	if len(as) != len(bs) || len(as) < 2 || as[0] != bs[0] || !strings.HasPrefix(as[0], `"`) {
		return false
	}
	for i := 1; i < len(as); i++ {
		if as[i] != bs[i] && constKey(as[i]) && constKey(bs[i]) {
			return false
		}
	}
	return true
}

// constKey reports a normalized argument that is a constant: a quoted
// string or a number.
func constKey(k string) bool {
	if strings.HasPrefix(k, `"`) {
		return true
	}
	_, err := strconv.ParseFloat(k, 64)
	return err == nil
}

// splitArgs splits a normalized call's arguments (norm joins them with
// ", ") at the commas outside quotes, brackets and parentheses.
func splitArgs(s string) []string {
	var out []string
	depth, start, quoted := 0, 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '(' || c == '[':
			depth++
		case c == ')' || c == ']':
			depth--
		case c == ',' && depth == 0 && i+1 < len(s) && s[i+1] == ' ':
			out = append(out, s[start:i])
			start = i + 2
			i++
		}
	}
	return append(out, s[start:])
}
