// Package zclaimvet is a go/analysis analyzer that finds racy sorted-set
// pollers: a read of due members (ZRANGEBYSCORE, ZRANGE ... BYSCORE, or a
// read by rank with scores) and a removal of members of the same key
// (ZREM, ZREMRANGEBYSCORE, ZREMRANGEBYRANK), sent as separate requests,
// outside a Lua script, a MULTI/EXEC transaction or a WATCH transaction.
// Two pollers read the same member before either removes it, and the job
// runs twice.
//
// It follows keys across functions and packages (analysis facts: "this
// function reads due members of its key argument i", "this method removes
// members of its receiver's field key", "this package uses a Redis
// client"), through the project's own client wrappers, closures,
// goroutines (a worker started before the read it removes for) and
// pipelines. It knows go-redis (v9 down to v6, and v5 to v2 from
// gopkg.in/redis.vN, those before v8 without a context: the typed
// methods, ZRangeArgs with ByScore, Pipelined, TxPipelined, Watch, and Do),
// redigo (Do, Send, MULTI/EXEC, WATCH, and arguments built with Args),
// radix v3 and v4 (Cmd and FlatCmd, their replies read into a receiver,
// and MULTI/EXEC), and rueidis and valkey-go (commands from the client's
// builder, sent with Do, DoCache or DoMulti; MULTI/EXEC within a DoMulti;
// WATCH; their go-redis-like adapters rueidiscompat and valkeycompat as
// go-redis).
//
// A removal of one member whose count decides who runs the job (a checked
// ZREM) is correct but costs a round trip per job: it gets a milder report
// of its own. A removal after an atomic claim of the id (LPOP or LMOVE from
// a ready list, SET NX of the id) only cleans up, and is not reported; a
// poll under a lock that a SET NX takes before the read, in the same
// function, is correct while the lock is held, and gets a report of its
// own. A read whose members
// are thrown away (the first value to _, or only its Err) is no poll.
// Reports are at the read, and name the removal's position.
//
//	go run github.com/zclaim/zclaim/cmd/zclaimvet@latest ./...
//
// Test files are skipped unless -tests is given. A "//zclaimvet:ok" comment
// on the line of the read or the removal silences a report.
package zclaimvet

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// Analyzer reports racy read-then-remove sorted-set pollers.
var Analyzer = &analysis.Analyzer{
	Name: "zclaimvet",
	Doc: "report sorted-set pollers that read due members and remove them in a separate request " +
		"(two workers take one job)",
	URL:       "https://pkg.go.dev/github.com/zclaim/zclaim/zclaimvet",
	Run:       run,
	FactTypes: []analysis.Fact{new(Summary), new(Uses)},
	// A package that does not fully type-check (a missing generated file,
	// a dependency of another version) is still read: only the Redis
	// clients' calls need their types.
	RunDespiteErrors: true,
}

var includeTests bool

func init() {
	Analyzer.Flags.BoolVar(&includeTests, "tests", false, "also analyse _test.go files")
}

// Messages of the two reports.
const (
	RacyMessage = "racy poller: %s reads due members of %s here, and %s at %s removes them in a separate request; " +
		"two workers read the same member before either removes it, and the job runs twice. " +
		"Claim in one script instead: zclaim's Broker.Claim, or its Dispatcher into asynq"
	CheckedMessage = "checked ZREM at %s after %s on %s: correct (only the worker whose ZREM removed the member " +
		"runs it), but one round trip per job and every other worker's read wasted; zclaim's Broker.Claim " +
		"takes a batch in one script"
	LockedMessage = "poller under a lock: %s reads due members of %s after the %s at %s, and %s at %s removes them: " +
		"correct while that lock is held, but a lock that expires first (a pause, a slow job) lets a second worker " +
		"read the same members and the job runs twice, and the workers take turns; zclaim's Broker.Claim takes " +
		"a batch in one script, without a lock"
)

// Summary is the fact of a function: the reads and removals of sorted-set
// keys that it leaves to its callers to pair, with keys written in terms
// of its parameters ("⟨p0⟩") and its receiver ("⟨r⟩.key").
type Summary struct {
	Accesses []Access
	// Sends is set for a function that sends any command it is given:
	// its parameter Cmd is the command, its variadic parameter Args the
	// key and arguments (func Do(cmd string, args ...any)).
	Sends *Sends
}

// Uses is the fact of a package whose code (its test files aside) imports
// a Redis client the analyzer knows, directly or through the packages it
// imports: Client is the first such client by path. Only a package that
// has it can hold other facts, so a package whose imports have none holds
// none either: zclaimvet as a vet tool answers go vet's call for such a
// package's facts without type-checking it.
type Uses struct{ Client string }

func (*Uses) AFact() {}

func (u *Uses) String() string { return "uses " + u.Client }

// uses exports the package's Uses fact, unless it is a client's own
// package (whose importers see the client itself) or imports no client,
// and reports whether the files analysed (with -tests, the test files too)
// can send a Redis command: the package is a client's, or they import a
// client or a package with the fact. Files that cannot send one hold no
// poller, and their package no other fact.
func uses(pass *analysis.Pass) bool {
	if IsClient(pass.Pkg.Path()) {
		return true
	}
	client, tests := "", false // tests: a test file analysed imports a client
	for _, f := range pass.Files {
		test := strings.HasSuffix(pass.Fset.Position(f.Pos()).Filename, "_test.go")
		if test && !includeTests {
			continue
		}
		for _, spec := range f.Imports {
			pn := pass.TypesInfo.PkgNameOf(spec)
			if pn == nil {
				continue
			}
			c, u := pn.Imported().Path(), new(Uses)
			if !IsClient(c) {
				if !pass.ImportPackageFact(pn.Imported(), u) {
					continue
				}
				c = u.Client
			}
			if test {
				tests = true
			} else if client == "" || c < client {
				client = c
			}
		}
	}
	if client != "" {
		pass.ExportPackageFact(&Uses{Client: client})
	}
	return client != "" || tests
}

// Sends names the parameters of a command-sending wrapper.
type Sends struct{ Cmd, Args int }

func (*Summary) AFact() {}

func (s *Summary) String() string {
	var b []string
	for _, a := range s.Accesses {
		b = append(b, a.String())
	}
	if s.Sends != nil {
		b = append(b, fmt.Sprintf("sends ⟨p%d⟩ ⟨p%d⟩...", s.Sends.Cmd, s.Sends.Args))
	}
	return "zset(" + strings.Join(b, ", ") + ")"
}

// Access is one read or removal.
type Access struct {
	Read    bool
	Name    string // the command, as Redis spells it
	Key     string // the key, normalized (see norm)
	Pos     string // where the command is sent, as file.go:line
	Checked bool   // a removal of one member whose count is tested
	// Forward: a removal whose members are the function's variadic
	// parameter, so its caller's arguments say whether it removes one.
	Forward bool
	Batch   bool // a removal of several members, or by range
	// Rank: a read by rank without scores (ZRANGE key 0 9), a read of due
	// members only where the scores are read too (Score) and compared.
	Rank  bool
	Score bool   // a ZSCORE: neither a read of members nor a removal
	Shown string // the key as the source writes it, for messages
	// Async: sent by a goroutine the function starts, which may run after
	// anything that follows the start.
	Async bool
}

func (a Access) String() string {
	v := "rm"
	switch {
	case a.Score:
		v = "score"
	case a.Read && a.Rank:
		v = "rank"
	case a.Read:
		v = "read"
	}
	return v + " " + a.Key
}

// event is an access as one function sends it, directly or through a call.
type event struct {
	Access
	node    ast.Node // the call in this function
	group   any      // non-nil: sent in one MULTI/EXEC with the others of its group
	claim   bool     // an atomic claim (LPOP, LMOVE, SET NX): what follows it is cleanup; Name is a lock's command
	gor     ast.Node // the go statement of this function that sends it, if any (then Async)
	callee  *types.Func
	calleeI int // the index of the access in the callee's summary
}

type analysisState struct {
	pass      *analysis.Pass
	ok        map[token.Position]bool
	summaries map[*types.Func]*Summary // this package's, being computed
	decls     map[*types.Func]*ast.FuncDecl
	watched   map[ast.Node]bool // function bodies run in a WATCH transaction
	final     bool              // the reporting pass
	reported  map[ast.Node]bool
	paired    map[*types.Func]map[int]bool // callee accesses paired at a call site
	origin    map[*types.Func][]ast.Node   // node of each access of this package's summaries
	discarded map[*ast.CallExpr]bool       // calls whose replies are thrown away (discard)
}

func run(pass *analysis.Pass) (any, error) {
	if !uses(pass) {
		return nil, nil
	}
	st := &analysisState{pass: pass, ok: okLines(pass), summaries: map[*types.Func]*Summary{},
		decls: map[*types.Func]*ast.FuncDecl{}, watched: map[ast.Node]bool{}, reported: map[ast.Node]bool{},
		paired: map[*types.Func]map[int]bool{}, origin: map[*types.Func][]ast.Node{}, discarded: map[*ast.CallExpr]bool{}}
	var funcs []*ast.FuncDecl
	var files []*ast.File
	for _, f := range pass.Files {
		name := pass.Fset.Position(f.Pos()).Filename
		if strings.HasSuffix(name, "_test.go") && !includeTests {
			continue
		}
		files = append(files, f)
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				funcs = append(funcs, fd)
				if fn, ok := pass.TypesInfo.Defs[fd.Name].(*types.Func); ok {
					st.decls[fn] = fd
				}
			}
		}
	}
	// Every function is known before the Watch calls are read: a named
	// function passed to Watch may be declared in a later file.
	for _, f := range files {
		st.findWatched(f)
		st.discard(f)
	}
	// Summaries of this package's functions: wrappers of wrappers need a
	// few rounds, until no summary changes (at most six).
	for round := 0; round < 6; round++ {
		changed := false
		for _, fd := range funcs {
			fn, _ := pass.TypesInfo.Defs[fd.Name].(*types.Func)
			if fn == nil || st.watched[fd.Body] {
				continue
			}
			s := st.summarize(fd)
			if old := st.summaries[fn]; old == nil && (len(s.Accesses) > 0 || s.Sends != nil) ||
				old != nil && (len(old.Accesses) != len(s.Accesses) || (old.Sends == nil) != (s.Sends == nil)) {
				st.summaries[fn] = s
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	st.final = true
	for _, fd := range funcs {
		if !st.watched[fd.Body] {
			st.summarize(fd)
		}
	}
	st.pairFields()
	for fn, s := range st.summaries {
		if len(s.Accesses) > 0 || s.Sends != nil {
			pass.ExportObjectFact(fn, s)
		}
	}
	return nil, nil
}

// findWatched marks the functions passed to go-redis' Watch: literals, local
// variables that hold one, and named functions or methods of the package.
func (st *analysisState) findWatched(f *ast.File) {
	pass := st.pass
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || !isWatch(pass, call) {
			return true
		}
		for _, a := range call.Args {
			switch x := ast.Unparen(a).(type) {
			case *ast.FuncLit:
				st.watched[x.Body] = true
			case *ast.Ident, *ast.SelectorExpr:
				var obj types.Object
				if id, ok := x.(*ast.Ident); ok {
					obj = pass.TypesInfo.Uses[id]
				} else {
					obj = pass.TypesInfo.Uses[x.(*ast.SelectorExpr).Sel]
				}
				switch o := obj.(type) {
				case *types.Func:
					if fd := st.decls[o]; fd != nil {
						st.watched[fd.Body] = true
					}
				case *types.Var:
					if lit := litOf(f, pass, o); lit != nil {
						st.watched[lit.Body] = true
					}
				}
			}
		}
		return true
	})
}

// litOf finds the function literal a variable is defined as.
func litOf(f *ast.File, pass *analysis.Pass, v *types.Var) *ast.FuncLit {
	var lit *ast.FuncLit
	ast.Inspect(f, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != len(as.Rhs) {
			return lit == nil
		}
		for i, l := range as.Lhs {
			if id, ok := l.(*ast.Ident); ok && pass.TypesInfo.ObjectOf(id) == v {
				if fl, ok := ast.Unparen(as.Rhs[i]).(*ast.FuncLit); ok {
					lit = fl
				}
			}
		}
		return lit == nil
	})
	return lit
}

// fnScope is what one function's keys are normalized against.
type fnScope struct {
	params map[types.Object]int
	recv   types.Object
	defs   map[types.Object]ast.Expr   // locals assigned once
	multi  map[types.Object]bool       // locals assigned more than once
	values map[types.Object][]ast.Expr // every value a local is given
	parent map[ast.Node]ast.Node
	body   *ast.BlockStmt
}

func (st *analysisState) scope(fd *ast.FuncDecl) *fnScope {
	s := &fnScope{params: map[types.Object]int{}, defs: map[types.Object]ast.Expr{}, multi: map[types.Object]bool{},
		values: map[types.Object][]ast.Expr{},
		parent: map[ast.Node]ast.Node{}, body: fd.Body}
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

// summarize collects the events of fd, pairs them (reporting in the final
// pass), and returns what it leaves to its callers.
func (st *analysisState) summarize(fd *ast.FuncDecl) *Summary {
	s := st.scope(fd)
	evs := st.events(s, fd.Body, nil)
	pairedIdx := st.pair(evs)
	// Each function literal (but those run in a pipeline, part of fd, and
	// those of a WATCH transaction) is a poller of its own.
	inline := map[*ast.FuncLit]bool{}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			if lit, _ := pipelined(st.pass, x); lit != nil {
				inline[lit] = true
			}

		case *ast.FuncLit:
			if !inline[x] && !st.watched[x.Body] {
				st.pair(st.events(s, x.Body, nil))
			}
		}
		return true
	})
	// A key both read and removed in one MULTI/EXEC is claimed atomically
	// there: its accesses are no caller's to pair.
	atomic := map[[2]any]int{}
	for _, ev := range evs {
		if ev.group != nil && !ev.claim {
			k := [2]any{ev.group, ev.Key}
			if ev.Read {
				atomic[k] |= 1
			} else {
				atomic[k] |= 2
			}
		}
	}
	out := &Summary{}
	var nodes []ast.Node
	for i, ev := range evs {
		if ev.claim || pairedIdx[i] || local(ev.Key) || guarded(evs, i) ||
			ev.group != nil && atomic[[2]any{ev.group, ev.Key}] == 3 {
			continue
		}
		out.Accesses = append(out.Accesses, ev.Access)
		nodes = append(nodes, ev.node)
	}
	if fn, ok := st.pass.TypesInfo.Defs[fd.Name].(*types.Func); ok && st.final {
		st.origin[fn] = nodes
	}
	out.Sends = st.sends(s, fd)
	return out
}

// sends recognizes a wrapper that sends the command it is given with the
// arguments it is given: a redigo Do or Send, or a call of another such
// wrapper, of a parameter and the variadic parameter spread.
func (st *analysisState) sends(s *fnScope, fd *ast.FuncDecl) *Sends {
	pass := st.pass
	var out *Sends
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || out != nil || !call.Ellipsis.IsValid() || len(call.Args) != 2 {
			return out == nil
		}
		cmdAt, argsAt := -1, -1
		if id, ok := ast.Unparen(call.Args[0]).(*ast.Ident); ok {
			if i, ok := s.params[pass.TypesInfo.ObjectOf(id)]; ok {
				cmdAt = i
			}
		}
		if id, ok := ast.Unparen(call.Args[1]).(*ast.Ident); ok {
			if i, ok := s.params[pass.TypesInfo.ObjectOf(id)]; ok {
				argsAt = i
			}
		}
		if cmdAt < 0 || argsAt < 0 {
			return true
		}
		if isRedigoSend(pass, call) || st.sendsOf(call) != nil {
			out = &Sends{Cmd: cmdAt, Args: argsAt}
		}
		return out == nil
	})
	return out
}

// summaryOf returns fn's summary: this package's, a fact of another's, or
// for a method of an interface (the project's own client interface), that
// of the method of the same name and signature of a type of the
// interface's package.
func (st *analysisState) summaryOf(fn *types.Func) *Summary {
	if s := st.summaries[fn]; s != nil {
		return s
	}
	if s := new(Summary); st.pass.ImportObjectFact(fn, s) {
		return s
	}
	sig, _ := fn.Type().(*types.Signature)
	if sig == nil || sig.Recv() == nil || !types.IsInterface(sig.Recv().Type()) || fn.Pkg() == nil {
		return nil
	}
	scope := fn.Pkg().Scope()
	for _, name := range scope.Names() {
		tn, ok := scope.Lookup(name).(*types.TypeName)
		if !ok || types.IsInterface(tn.Type()) {
			continue
		}
		obj, _, _ := types.LookupFieldOrMethod(types.NewPointer(tn.Type()), true, fn.Pkg(), fn.Name())
		m, ok := obj.(*types.Func)
		if !ok || m == fn {
			continue
		}
		ms, _ := m.Type().(*types.Signature)
		if ms == nil || !types.Identical(types.NewSignatureType(nil, nil, nil, ms.Params(), ms.Results(), ms.Variadic()),
			types.NewSignatureType(nil, nil, nil, sig.Params(), sig.Results(), sig.Variadic())) {
			continue
		}
		if s := st.summaries[m]; s != nil {
			return s
		}
		if s := new(Summary); st.pass.ImportObjectFact(m, s) {
			return s
		}
	}
	return nil
}

// sendsOf returns the Sends of the wrapper call calls, nil if none.
func (st *analysisState) sendsOf(call *ast.CallExpr) *Sends {
	fn := calleeOf(st.pass, call)
	if fn == nil {
		return nil
	}
	if sum := st.summaries[fn]; sum != nil {
		return sum.Sends
	}
	sum := new(Summary)
	if st.pass.ImportObjectFact(fn, sum) {
		return sum.Sends
	}
	return nil
}

func calleeOf(pass *analysis.Pass, call *ast.CallExpr) *types.Func {
	switch f := funOf(call).(type) {
	case *ast.Ident:
		fn, _ := pass.TypesInfo.Uses[f].(*types.Func)
		return fn
	case *ast.SelectorExpr:
		fn, _ := pass.TypesInfo.Uses[f.Sel].(*types.Func)
		return fn
	}
	return nil
}

// funOf returns the function call calls, without its type arguments
// (Due[string](...)).
func funOf(call *ast.CallExpr) ast.Expr {
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.IndexExpr:
		return ast.Unparen(f.X)
	case *ast.IndexListExpr:
		return ast.Unparen(f.X)
	default:
		return f
	}
}

// viaSends reads a command sent through a wrapper: Do("ZREM", key, id),
// or Do("ZREM", args...) with args the caller's own variadic parameter,
// whose first element is then the key.
func (st *analysisState) viaSends(s *fnScope, call *ast.CallExpr, w *Sends) (event, bool) {
	pass := st.pass
	if w.Cmd >= len(call.Args) || w.Args > len(call.Args) {
		return event{}, false
	}
	if len(st.constStrings(s, call.Args[w.Cmd])) == 0 {
		return event{}, false
	}
	rest := call.Args[w.Args:]
	if call.Ellipsis.IsValid() && len(rest) == 1 {
		id, ok := ast.Unparen(rest[0]).(*ast.Ident)
		if !ok {
			return event{}, false
		}
		k, ok := s.params[pass.TypesInfo.ObjectOf(id)]
		if !ok {
			return event{}, false
		}
		// The key is the first of the caller's own arguments.
		lit := &ast.CallExpr{Fun: call.Fun, Args: []ast.Expr{call.Args[w.Cmd]}}
		ev, ok := st.doCommand(s, lit, []ast.Expr{call.Args[w.Cmd], call.Args[w.Cmd]})
		if !ok {
			return event{}, false
		}
		ev.node, ev.Pos = call, pos(pass, call)
		ev.Key, ev.Shown = "⟨p"+strconv.Itoa(k)+"[0]⟩", id.Name+"[0]"
		if !ev.Read {
			ev.Forward, ev.Batch, ev.Checked = true, false, false
		}
		return ev, true
	}
	ev, ok := st.doCommand(s, call, append([]ast.Expr{call.Args[w.Cmd]}, rest...))
	ev.node = call
	return ev, ok
}

// scoresRead reports a ZSCORE of key among evs: a read by rank whose
// members' scores are then compared in Go is a read of due members.
func scoresRead(evs []event, key string) bool {
	for _, e := range evs {
		if e.Score && e.Key == key {
			return true
		}
	}
	return false
}

// guarded reports an access after an atomic claim in the same function:
// the claim decided who runs the job.
func guarded(evs []event, i int) bool {
	for j := range i {
		if evs[j].claim {
			return true
		}
	}
	return false
}

// pair reports, in the final pass, each read followed by a removal of the
// same key (the first such removal); it returns the events it paired.
// A claim between the read and the removal decided who runs the job: the
// removal cleans up, unreported. Before the read, a lock (SET NX) makes
// the poll correct while it is held, which gets a report of its own; any
// other claim there leaves the removal unreported, as cleanup after it.
func (st *analysisState) pair(evs []event) map[int]bool {
	paired := map[int]bool{}
	for i, rm := range evs {
		if rm.Read || rm.Score || rm.claim {
			continue
		}
		claimed := -1 // the last claim before the removal
		for k := i - 1; k >= 0 && claimed < 0; k-- {
			if evs[k].claim {
				claimed = k
			}
		}
		for j := i - 1; j >= 0; j-- {
			r := evs[j]
			if !r.Read || r.claim || r.Key != rm.Key || r.Rank && !scoresRead(evs[j+1:i], r.Key) {
				continue
			}
			if r.group != nil && r.group == rm.group {
				break // one MULTI/EXEC: atomic
			}
			var lock *event
			if claimed >= 0 {
				if lock = lockBefore(evs[:j]); claimed > j || lock == nil {
					break
				}
			}
			paired[i], paired[j] = true, true
			if st.final {
				st.report(r, rm, lock)
			}
			break
		}
		if rm.Async && !paired[i] {
			st.pairLater(evs, i, claimed, paired)
		}
	}
	return paired
}

// pairLater pairs removal evs[i], sent by a goroutine started before the
// read (a worker that removes what the poll loop after it hands over),
// with a later read of its key outside that goroutine. A claim before the
// removal in the goroutine makes the removal cleanup; a lock before the
// read, a poll under a lock.
func (st *analysisState) pairLater(evs []event, i, claimed int, paired map[int]bool) {
	rm := evs[i]
	if claimed >= 0 && evs[claimed].Async {
		return
	}
	for j := i + 1; j < len(evs); j++ {
		r := evs[j]
		if !r.Read || r.claim || r.gor != nil && r.gor == rm.gor || r.Key != rm.Key || r.Rank && !scoresRead(evs[j+1:], r.Key) {
			continue
		}
		if r.group != nil && r.group == rm.group {
			return
		}
		var lock *event
		if claimed >= 0 {
			if lock = lockBefore(evs[:j]); lock == nil {
				return
			}
		}
		paired[i], paired[j] = true, true
		if st.final {
			st.report(r, rm, lock)
		}
		return
	}
}

// lockBefore returns the last lock taken among evs (a SET NX), or nil.
func lockBefore(evs []event) *event {
	for k := len(evs) - 1; k >= 0; k-- {
		if evs[k].claim && evs[k].Name != "" {
			return &evs[k]
		}
	}
	return nil
}

func (st *analysisState) report(r, rm event, lock *event) {
	for _, e := range []event{r, rm} {
		if e.callee != nil {
			if st.paired[e.callee] == nil {
				st.paired[e.callee] = map[int]bool{}
			}
			st.paired[e.callee][e.calleeI] = true
		}
	}
	if st.reported[r.node] || st.ok[line(st.pass, r.node)] || st.ok[line(st.pass, rm.node)] {
		return
	}
	st.reported[r.node] = true
	key := r.Shown
	if key == "" {
		key = display(r.Key)
	}
	at := rm.Pos
	switch {
	case rm.Checked:
		st.pass.Reportf(r.node.Pos(), CheckedMessage, at, r.Name, key)
	case lock != nil:
		st.pass.Reportf(r.node.Pos(), LockedMessage, r.Name, key, lock.Name, lock.Pos, rm.Name, at)
	default:
		st.pass.Reportf(r.node.Pos(), RacyMessage, r.Name, key, rm.Name, at)
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

// events returns the accesses body sends, in source order: its own
// commands, those of the functions it calls (from their summaries), and
// those of the closures it hands to Pipelined (inline) and TxPipelined (one
// group); not those of other function literals or of WATCH transactions.
func (st *analysisState) events(s *fnScope, body *ast.BlockStmt, group any) []event {
	pass := st.pass
	var evs []event
	var multi any // a redigo MULTI in progress
	watches := false
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.GoStmt:
			// A goroutine runs beside what follows it.
			start := len(evs)
			ast.Inspect(x.Call, visit)
			for k := start; k < len(evs); k++ {
				evs[k].Async = true
				if evs[k].gor == nil {
					evs[k].gor = x
				}
			}
			return false
		case *ast.CallExpr:
			if isWatch(pass, x) {
				return false
			}
			if cmd, ok := namedCmd(pass, x); ok {
				switch cmd {
				case "WATCH":
					watches = true
				case "MULTI":
					multi = x
				case "EXEC", "DISCARD":
					multi = nil
				}
			}
			// A literal handed to a runner (errgroup's and WaitGroup's
			// Go, a pool's Submit, time.AfterFunc) runs beside what
			// follows, as a goroutine does.
			if lits := runLiterals(x); lits != nil {
				for _, lit := range lits {
					start := len(evs)
					evs = append(evs, st.events(s, lit.Body, group)...)
					for k := start; k < len(evs); k++ {
						evs[k].Async = true
						if evs[k].gor == nil {
							evs[k].gor = lit
						}
					}
				}
				return false
			}
			// A literal called where it stands (go func(){...}(),
			// defer func(){...}()) runs as part of this function.
			if lit, ok := ast.Unparen(x.Fun).(*ast.FuncLit); ok {
				evs = append(evs, st.events(s, lit.Body, group)...)
				return false
			}
			if lit, tx := pipelined(pass, x); lit != nil {
				g := group
				if tx {
					g = lit
				}
				evs = append(evs, st.events(s, lit.Body, g)...)
				return false
			}
			g := group
			if multi != nil {
				g = multi
			}
			if txg := st.txPipe(s, x); txg != nil {
				g = txg
			}
			if revs, watch, ok := st.rueidisEvents(s, x, g); ok {
				watches = watches || watch
				for _, ev := range revs {
					if !ev.Read || !st.discarded[x] {
						evs = append(evs, ev)
					}
				}
				return true
			}
			if ev, ok := st.classify(s, x); ok {
				if ev.Read && st.discarded[x] {
					return true // no members read: nothing polled
				}
				ev.group = g
				evs = append(evs, ev)
				return true
			}
			if w := st.sendsOf(x); w != nil {
				if ev, ok := st.viaSends(s, x, w); ok {
					ev.group = g
					evs = append(evs, ev)
				}
				return true
			}
			if claim, lock := claimOf(pass, x); claim {
				evs = append(evs, event{node: x, claim: true, Access: Access{Name: lock, Pos: pos(pass, x)}})
				return true
			}
			evs = append(evs, st.viaCallee(s, x, g)...)
		}
		return true
	}
	ast.Inspect(body, visit)
	if watches {
		return nil
	}
	return evs
}

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
	var lits []*ast.FuncLit
	for _, a := range call.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			lits = append(lits, lit)
		}
	}
	return lits
}

// pipelined returns the function literal of a go-redis Pipelined or
// TxPipelined call, and whether it is the MULTI/EXEC one.
func pipelined(pass *analysis.Pass, call *ast.CallExpr) (*ast.FuncLit, bool) {
	fn, name := goRedisMethod(pass, call)
	if fn == nil || name != "Pipelined" && name != "TxPipelined" {
		return nil, false
	}
	for _, a := range call.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			return lit, name == "TxPipelined"
		}
	}
	return nil, false
}

// txPipe returns the group of a command sent on a variable that holds a
// go-redis TxPipeline (MULTI/EXEC), nil otherwise.
func (st *analysisState) txPipe(s *fnScope, call *ast.CallExpr) any {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	id, ok := ast.Unparen(sel.X).(*ast.Ident)
	if !ok {
		return nil
	}
	o := st.pass.TypesInfo.ObjectOf(id)
	d, ok := s.defs[o]
	if !ok {
		return nil
	}
	if c, ok := ast.Unparen(d).(*ast.CallExpr); ok {
		if fn, name := goRedisMethod(st.pass, c); fn != nil && name == "TxPipeline" {
			return o
		}
	}
	return nil
}

// goRedisMethod returns the go-redis function call calls, and its name.
func goRedisMethod(pass *analysis.Pass, call *ast.CallExpr) (*types.Func, string) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil, ""
	}
	fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil || !isGoRedis(fn.Pkg().Path()) && !isCompat(fn.Pkg().Path()) {
		return nil, ""
	}
	return fn, sel.Sel.Name
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

// claimOf tells whether a command hands an id to one caller only (claim):
// a pop or move from a list, or a SET NX, which is also a lock: the name
// it is reported by, "" for any other claim.
func claimOf(pass *analysis.Pass, call *ast.CallExpr) (claim bool, lock string) {
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

// discard marks the calls of f whose replies the code throws away: the
// first value assigned to _ (of the reply, of a method of it such as Val,
// Result or AsStrSlice, or of a redigo reply helper of it), or only the
// error asked for (Err, or rueidis' Error). A read of due members
// whose members no one gets polls nothing: it checks that the key can be
// read, before a removal of what has expired, say.
func (st *analysisState) discard(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.AssignStmt:
			if len(x.Rhs) != 1 || len(x.Lhs) == 0 {
				break
			}
			if id, ok := x.Lhs[0].(*ast.Ident); !ok || id.Name != "_" {
				break
			}
			call, ok := ast.Unparen(x.Rhs[0]).(*ast.CallExpr)
			if !ok {
				break
			}
			st.discarded[call] = true
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && len(call.Args) == 0 {
				if inner, ok := ast.Unparen(sel.X).(*ast.CallExpr); ok {
					st.discarded[inner] = true
				}
			}
			if fn := typeutil.StaticCallee(st.pass.TypesInfo, call); fn != nil && fn.Pkg() != nil && isRedigo(fn.Pkg().Path()) && len(call.Args) == 1 {
				if inner, ok := ast.Unparen(call.Args[0]).(*ast.CallExpr); ok {
					st.discarded[inner] = true
				}
			}
		case *ast.SelectorExpr:
			if x.Sel.Name == "Err" || x.Sel.Name == "Error" {
				if call, ok := ast.Unparen(x.X).(*ast.CallExpr); ok {
					st.discarded[call] = true
				}
			}
		}
		return true
	})
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
// command sent by name: redigo's Do or Send, radix's Cmd or FlatCmd.
func namedArgs(pass *analysis.Pass, call *ast.CallExpr) ([]ast.Expr, bool) {
	if isRedigoSend(pass, call) {
		return call.Args, true
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
			return mk("ZRANGEBYSCORE", call.Args[k], true), true
		case rankReadMethods[name]:
			return mk("ZRANGE WITHSCORES", call.Args[k], true), true
		case name == "ZRange" || name == "ZRevRange":
			ev := mk(strings.ToUpper(name), call.Args[k], true)
			ev.Rank = true
			return ev, true
		case name == "ZScore":
			ev := mk("ZSCORE", call.Args[k], false)
			ev.Score = true
			return ev, true
		case argsMethods[name]:
			if key, byScore := st.zrangeArgs(s, call.Args[k]); key != nil && (byScore || name == "ZRangeArgsWithScores") {
				n := "ZRANGE BYSCORE"
				if !byScore {
					n = "ZRANGE WITHSCORES"
				}
				return mk(n, key, true), true
			}
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
	return ok && fn.Pkg() != nil && isRedigo(fn.Pkg().Path()) ||
		pass.TypesInfo.Uses[sel.Sel] == nil && importsRedigo(pass.Pkg)
}

// doCommand reads a command sent as Do(name, key, args...).
func (st *analysisState) doCommand(s *fnScope, call *ast.CallExpr, args []ast.Expr) (event, bool) {
	if len(args) < 2 {
		return event{}, false
	}
	spread := call.Ellipsis.IsValid()
	if len(args) == 2 && spread {
		if rest, ok := st.argsBuilt(s, args[1]); ok && len(rest) > 0 {
			args, spread = append([]ast.Expr{args[0]}, rest...), false
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
// and those of each Add, through a local assigned once. It reports false
// for anything else, or an AddFlat (a struct's fields: no key to read).
func (st *analysisState) argsBuilt(s *fnScope, e ast.Expr) ([]ast.Expr, bool) {
	pass := st.pass
	e = ast.Unparen(e)
	if id, ok := e.(*ast.Ident); ok {
		d, ok := s.defs[pass.TypesInfo.ObjectOf(id)]
		if !ok {
			return nil, false
		}
		e = ast.Unparen(d)
	}
	named, ok := pass.TypesInfo.TypeOf(e).(*types.Named)
	if !ok || named.Obj().Name() != "Args" || named.Obj().Pkg() == nil || !isRedigo(named.Obj().Pkg().Path()) {
		return nil, false
	}
	switch x := e.(type) {
	case *ast.CompositeLit:
		return slices.Clone(x.Elts), true
	case *ast.CallExpr:
		sel, ok := x.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Add" || x.Ellipsis.IsValid() {
			return nil, false
		}
		base, ok := st.argsBuilt(s, sel.X)
		return append(base, x.Args...), ok
	}
	return nil, false
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
	return st.zsetCommand(s, call, cmd, args[1], has, args[2:], spread)
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
		return ev, true
	case cmd == "ZSCORE":
		ev := mk(cmd, false)
		ev.Score = true
		return ev, true
	case removeCmds[cmd]:
		ev := mk(cmd, false)
		st.removal(s, &ev, call, cmd == "ZREM", members, spread)
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
	ev.Checked = single && st.countTested(s, call)
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

// viaCallee translates the accesses of a function the call calls (its
// summary) into this function's terms.
func (st *analysisState) viaCallee(s *fnScope, call *ast.CallExpr, group any) []event {
	pass := st.pass
	var fn *types.Func
	var recv ast.Expr
	switch f := funOf(call).(type) {
	case *ast.Ident:
		fn, _ = pass.TypesInfo.Uses[f].(*types.Func)
	case *ast.SelectorExpr:
		fn, _ = pass.TypesInfo.Uses[f.Sel].(*types.Func)
		if sel := pass.TypesInfo.Selections[f]; sel != nil {
			recv = f.X
		}
	}
	if fn == nil {
		return nil
	}
	sum := st.summaryOf(fn)
	if sum == nil {
		return nil
	}
	args := make([]string, len(call.Args))
	for i, a := range call.Args {
		args[i] = st.norm(s, a, 0)
		if i == len(call.Args)-1 && call.Ellipsis.IsValid() {
			if strings.HasPrefix(args[i], "⟨p") {
				args[i] += "..." // first of it: the caller's own first
			} else {
				args[i] = "⟨? spread " + strconv.Itoa(int(a.Pos())) + "⟩"
			}
		}
	}
	r := "⟨? " + strconv.Itoa(int(call.Pos())) + "⟩"
	if recv != nil {
		r = st.norm(s, recv, 0)
	}
	var evs []event
	for i, a := range sum.Accesses {
		key, ok := substitute(a.Key, args, r)
		if !ok {
			continue
		}
		ev := event{Access: a, node: call, group: group, callee: fn, calleeI: i}
		if a.Async {
			ev.gor = call // the callee's goroutines: their order is the callee's to pair
		}
		ev.Key = key
		ev.Pos = pos(pass, call)
		if !strings.Contains(ev.Name, " (in ") {
			ev.Name += " (in " + fn.Name() + ")"
		}
		if i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(a.Key, "⟨p"), "⟩"), "[0]")); err == nil &&
			i < len(call.Args) {
			ev.Shown = render(pass, call.Args[i])
		} else if strings.HasPrefix(a.Key, "⟨r⟩.") && recv != nil {
			ev.Shown = render(pass, recv) + strings.TrimPrefix(a.Key, "⟨r⟩")
		}
		if !a.Read && !a.Score && !a.Forward && a.Checked {
			// The callee tests the count and returns the outcome: a check
			// only where this caller tests it in turn.
			ev.Checked = st.countTested(s, call)
		}
		if !a.Read && a.Forward {
			sig := fn.Type().(*types.Signature)
			n := len(call.Args) - (sig.Params().Len() - 1)
			if strings.HasSuffix(a.Key, "[0]⟩") {
				n-- // the first is the key
			}
			single := n == 1 && !call.Ellipsis.IsValid() && !isSlice(pass, call.Args[len(call.Args)-1])
			ev.Batch = !single
			ev.Checked = single && st.countTested(s, call)
		}
		evs = append(evs, ev)
	}
	return evs
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

// pairFields reports what a type's methods leave unpaired: a read of a
// receiver's field key in one method and a removal of it in another (the
// batch handed on between them), unless a call site already paired them.
// recvNamed returns the named type of fn's receiver, or nil.
func recvNamed(fn *types.Func) *types.Named {
	recv := fn.Type().(*types.Signature).Recv()
	if recv == nil {
		return nil
	}
	t := recv.Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	named, _ := t.(*types.Named)
	return named
}

func (st *analysisState) pairFields() {
	type acc struct {
		fn   *types.Func
		i    int
		a    Access
		node ast.Node
	}
	byKey := map[string][]acc{}
	var keys []string
	for fn, s := range st.summaries {
		named := recvNamed(fn)
		if named == nil {
			continue
		}
		for i, a := range s.Accesses {
			if !strings.HasPrefix(a.Key, "⟨r⟩.") || st.paired[fn][i] || i >= len(st.origin[fn]) {
				continue
			}
			// An access that a method holds from another method of the
			// type it calls (Start calls poll) is that one's, already here.
			if call, ok := st.origin[fn][i].(*ast.CallExpr); ok {
				if c := calleeOf(st.pass, call); c != nil && c != fn && st.summaries[c] != nil && recvNamed(c) == named {
					continue
				}
			}
			k := named.Obj().Name() + " " + a.Key
			if byKey[k] == nil {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], acc{fn, i, a, st.origin[fn][i]})
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		list := byKey[k]
		slices.SortFunc(list, func(x, y acc) int { return int(x.node.Pos() - y.node.Pos()) })
		for _, r := range list {
			if !r.a.Read || r.a.Rank {
				continue
			}
			for _, rm := range list {
				if rm.a.Read || rm.a.Score || rm.fn == r.fn {
					continue
				}
				st.report(event{Access: r.a, node: r.node}, event{Access: rm.a, node: rm.node}, nil)
				break
			}
		}
	}
}

// zrangeArgs reads the Key of a ZRangeArgs literal (or of the local it is
// assigned to) and whether it has ByScore set.
func (st *analysisState) zrangeArgs(s *fnScope, e ast.Expr) (key ast.Expr, byScore bool) {
	pass := st.pass
	e = ast.Unparen(e)
	if id, ok := e.(*ast.Ident); ok {
		if d, ok := s.defs[pass.TypesInfo.ObjectOf(id)]; ok {
			e = ast.Unparen(d)
		}
	}
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = u.X
	}
	lit, ok := e.(*ast.CompositeLit)
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
	return key, byScore
}

// IsClient reports whether path is the import path of a package of a Redis
// client the analyzer knows (go-redis, redigo, rueidis, valkey-go or radix). Only a package that
// imports one, directly or through other packages, can hold a fact (Uses).
func IsClient(path string) bool {
	return isGoRedis(path) || isRedigo(path) || isRueidis(path) || isRadix(path)
}

// isGoRedis reports go-redis: v9 on, v6 to v8, and v2 to v5 (gopkg.in/redis.vN).
func isGoRedis(path string) bool {
	return strings.HasPrefix(path, "github.com/redis/go-redis/") || strings.HasPrefix(path, "github.com/go-redis/redis") ||
		strings.HasPrefix(path, "gopkg.in/redis.v")
}

func isRedigo(path string) bool {
	return strings.HasPrefix(path, "github.com/gomodule/redigo/") ||
		strings.HasPrefix(path, "github.com/garyburd/redigo/")
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
	fn, name := goRedisMethod(pass, call)
	return fn != nil && name == "Watch"
}

func pos(pass *analysis.Pass, n ast.Node) string {
	p := pass.Fset.Position(n.Pos())
	return filepath.Base(p.Filename) + ":" + strconv.Itoa(p.Line)
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
