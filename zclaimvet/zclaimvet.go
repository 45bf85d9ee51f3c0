// Package zclaimvet is a go/analysis analyzer that finds racy sorted-set
// pollers: a read of due members (ZRANGEBYSCORE, ZRANGE ... BYSCORE, or a
// read by rank with scores) and a removal of members of the same key
// (ZREM, ZREMRANGEBYSCORE, ZREMRANGEBYRANK, or a ZADD that puts a member
// it read back at a new score, moving a periodic job to its next time:
// reschedule.go), sent as separate requests, outside a Lua script, a
// MULTI/EXEC transaction or a WATCH transaction. Two pollers read the same
// member before either removes it, and the job runs twice.
//
// It follows keys across functions and packages (analysis facts: "this
// function reads due members of its key argument i", "this method removes
// members of its receiver's field key", "this package uses a Redis
// client"), through the project's own client wrappers, closures,
// goroutines (a worker started before the read it removes for), callbacks
// (a literal kept in a value or returned, such as a message's Ack, runs
// after what precedes it), the literals handed to retry helpers (retry-go,
// backoff, go-retry), loops (a ZREM of the batch read in the iteration
// before, sent before the next read) and pipelines. It knows go-redis (v9
// down to v6, and v5 to v2 from gopkg.in/redis.vN, those before v8 without
// a context: the typed methods, ZRangeArgs with ByScore, Pipelined,
// TxPipelined, Watch, and Do),
// redigo (Do, Send, MULTI/EXEC, WATCH, and arguments built with Args or
// in a slice sent spread, a literal or an empty slice appended to),
// radix v3 and v4 (Cmd and FlatCmd, their replies read into a receiver,
// and MULTI/EXEC), and rueidis and valkey-go (commands from the client's
// builder, sent with Do, DoCache or DoMulti; MULTI/EXEC within a DoMulti;
// WATCH; their go-redis-like adapters rueidiscompat and valkeycompat as
// go-redis), and GoFrame's gredis (Do, v1's DoVar, and its sorted-set
// methods: ZRange with ByScore, ZScore, ZRem, ZRemRangeByScore and
// ZRemRangeByRank). An interface a project declares over a client (for
// its tests' fakes) is read as the client: methods whose first result is
// of go-redis' types, redigo's Do and Send, rueidis' Do and B (also a
// wrapper's that take and give rueidis' types).
//
// A removal of one member whose count decides who runs the job (a checked
// ZREM, also when several are sent in a pipeline whose replies are kept in
// a slice or map, in rueidis' DoMulti, or with redigo's Send and every
// Receive after it on that connection, and a reply's count is tested;
// or when a helper returns the count and its caller tests it)
// is correct but costs a ZREM per job, and every other worker's read is
// wasted: it gets a milder report of its own. A removal after an atomic
// claim of the id (LPOP or LMOVE from a ready list, SET NX of the id, a
// ZADD or SADD of the id into another set whose count is tested), or
// after a checked ZREM (of the member from another set, say), only cleans
// up, and is not reported, unless the function lets that lock go after
// the removal or in a defer (a DEL of its key, a lock library's release,
// or a helper named for unlocking that sends one: Summary's Unlock), which
// gets a report of its own; a poll under a lock (a SET NX, redsync's
// Mutex.Lock, redislock's Obtain, or a project's helper named for taking
// a lock that takes one and sends nothing else) taken before the read in
// the same function, or by every caller before its call of a function no
// other package can call (or by the package's helper that such a function
// is handed to as a value, before it calls it), is correct while the lock
// is held, and gets a
// report of its own. A read whose members are thrown away (the first
// value to _, or only its Err) is no poll, and neither is a sweep: a read
// (here, or by a function of the package that only reads and returns)
// whose members, held in a variable, go nowhere but back to Redis (the
// removal, other reads and removals of them or of keys named from them,
// through ranges that do nothing else and add up counts, or a helper of
// the package that does the same; how many there are may go anywhere), so
// that nothing runs on them.
// A removal of one member on a path that then only does such things and
// leaves, where the function hands that member on another path to a Lua
// script whose keys include the removal's key, is a cleanup (a reaper
// dropping a stale claim whose job is gone, the script taking the rest):
// the script is taken to claim what it is handed, and the removal pairs
// with no read (cleanup.go).
// A page of a listing read by position from an offset (ZRANGE key off
// off+n WITHSCORES) in one method is not paired with a removal in
// another method of its type: a user's action on one member.
// A read of due members that hands them on (a push to a list or stream,
// a publish) with no claim or removal of its key after it, where another
// function of the package removes or moves members of that key (a
// worker's update once it ran the job), is racy too: until that update
// every poll, on every instance, hands the same member on again
// (handoff.go). A hand-off of a set that no code of the package takes
// members out of is not reported: the analyzer cannot tell who does.
// A script whose source is in the code (go-redis' or redigo's NewScript,
// go-redis' Eval, or an EVAL sent by name, of a constant; also through the
// project's helper that runs the source it is given) and that removes
// members it is handed from a sorted set without asking first (a ZREM that
// is a statement of its own, of a key the script reads nothing of, in a
// script that compares nothing with its arguments and tests no removal's or
// pop's reply) removes them as a plain ZREM would: handed members a read
// saw before it, it is paired with that read (lua.go). A script whose
// source is not in the code is taken to decide.
// Reports are at the read, and name the removal's position.
//
//	go run github.com/zclaim/zclaim/cmd/zclaimvet@latest ./...
//
// Test files are skipped unless -tests is given. A
// "//zclaimvet:ignore reason" comment on the line of the read or the
// removal marks a reviewed site: its report is left out, and each package
// says on stderr how many it left out and why ("//zclaimvet:ok" does the
// same without a reason). A racy poller's report carries a suggested fix
// (zclaimvet -fix -diff shows it): a comment above the read that names the
// one-step claim to put there.
package zclaimvet

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
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

// Messages of the reports. Where a removal stands the verbs say what it
// does to the members: removes them, or (a ZADD at a new score) moves them
// to a later score.
const (
	RacyMessage = "racy poller: %s reads due members of %s here, and %s at %s %s in a separate request; " +
		"two workers read the same member before either %s it, and the job runs twice. " +
		"Claim in one script instead: zclaim's Broker.Claim, or its Dispatcher into asynq"
	CheckedMessage = "checked ZREM at %s after %s on %s: correct (only the worker whose ZREM removed the member " +
		"runs it), but a ZREM per job and every other worker's read wasted; zclaim's Broker.Claim " +
		"takes a batch in one script"
	LockedMessage = "poller under a lock: %s reads due members of %s after the %s at %s, and %s at %s %s: " +
		"correct while that lock is held, but a lock that expires first (a pause, a slow job) lets a second worker " +
		"read the same members and the job runs twice, and the workers take turns; zclaim's Broker.Claim takes " +
		"a batch in one script, without a lock"
	ReleasedMessage = "racy poller with a lock per job: %s reads due members of %s, the %s at %s locks one, and %s at %s " +
		"%s, but the lock is let go at %s: a worker that read the member before the %s takes the lock " +
		"after that, and the job runs twice. Claim in one script instead: zclaim's Broker.Claim, or its Dispatcher into asynq"
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
	// Lock names the lock a helper named for one (TryLock, acquireLock,
	// Obtain) takes and returns holding: a SET NX, or a lock library's.
	Lock string
	// Unlock is set for a helper named for letting a lock go (Unlock,
	// releaseLock) that sends a DEL, an UNLINK, a script or a lock
	// library's release: calling it lets go a lock on a member.
	Unlock bool
	// Runs is set for a function that runs a Lua script with its
	// parameter Keys as the script's keys and its variadic parameter Args
	// as its arguments (func run(ctx, rdb, name string, keys []string,
	// args ...any)): a call of it hands those to a script (cleanup.go).
	Runs *Runs
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

// Runs: see Summary. Src is the parameter (from 1) that holds the
// script's source, where the function makes its script of one (lua.go);
// 0 for none.
type Runs struct{ Keys, Args, Src int }

func (*Summary) AFact() {}

func (s *Summary) String() string {
	var b []string
	for _, a := range s.Accesses {
		b = append(b, a.String())
	}
	if s.Sends != nil {
		b = append(b, fmt.Sprintf("sends ⟨p%d⟩ ⟨p%d⟩...", s.Sends.Cmd, s.Sends.Args))
	}
	if s.Lock != "" {
		b = append(b, "lock "+s.Lock)
	}
	if s.Unlock {
		b = append(b, "unlock")
	}
	if s.Runs != nil {
		r := fmt.Sprintf("runs ⟨p%d⟩ ⟨p%d⟩...", s.Runs.Keys, s.Runs.Args)
		if s.Runs.Src > 0 {
			r += fmt.Sprintf(" of ⟨p%d⟩", s.Runs.Src-1)
		}
		b = append(b, r)
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
	// Guards: a Checked removal whose test leaves the function before the
	// work after it (if n == 0 { return nil }), in a function that returns
	// no count or bool: it acts on its own check, whatever its callers do
	// with what it returns (ownGuard).
	Guards bool
	// Forward: a removal whose members are the function's variadic
	// parameter, so its caller's arguments say whether it removes one.
	Forward bool
	Batch   bool // a removal of several members, or by range
	// Moves: a ZADD of a member the function read (readMember) back on
	// its key, at a new score: it leaves the due range as a removed one
	// does (reschedule.go).
	Moves bool
	// MoveArg: a ZADD whose member is the function's parameter MoveArg-1
	// (or one it ranges over), or a script's removal of the members of
	// that parameter (lua.go): a move or a removal only where a caller
	// hands it a member it read, as the caller's event (viaCallee); 0 for
	// none.
	MoveArg int
	// Rank: a read by rank without scores (ZRANGE key 0 9), a read of due
	// members only where the scores are read too (Score) and compared.
	Rank bool
	// Head: a read by rank of the first member alone (ZRANGE key 0 0): a
	// removal of its key after it takes that member off the head, a pop
	// sent in two requests, whatever its score.
	Head  bool
	Score bool // a ZSCORE: neither a read of members nor a removal
	// Fixed: a read of one constant score (ZRANGEBYSCORE key 0 0): a
	// lookup of the members parked there (the dead ones), which no clock
	// brings due. pairFields does not pair it with a removal in another
	// method; a function that reads and removes it itself is still a poll.
	Fixed bool
	// Page: a read by rank from a start that is not 0 (ZRANGE key off
	// off+n WITHSCORES): a page of a listing, a console's. pairFields
	// does not pair it with a removal in another method (the user's
	// action on one member); a function that reads and removes it itself
	// is still a poll.
	Page bool
	// Lookup: a read of one score that is not constant and not the
	// clock's (ZRANGEBYSCORE key s s, s the caller's): a lookup of the
	// members at the score its caller names (a job by its time and id),
	// not a read of what came due. Neither pair nor pairFields pairs it.
	Lookup bool
	// LookupArg: for a Lookup whose score is the function's parameter
	// LookupArg-1 (or made from it), 1 + that index: a caller that passes
	// the clock's time there reads what came due (viaCallee); 0 for none.
	LookupArg int
	// Exact: a removal by one score (ZREMRANGEBYSCORE key s s): a delete
	// of what sits at the score its caller names. pairFields does not pair
	// it with a read in another method; a function that reads and removes
	// at each score it read is still a poll.
	Exact bool
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
	case a.Read && a.Fixed:
		v = "read fixed"
	case a.Read && a.Page:
		v = "read page"
	case a.Read && a.Lookup:
		v = "lookup"
	case a.Read:
		v = "read"
	case a.Moves && a.MoveArg > 0:
		v = "mv ⟨p" + strconv.Itoa(a.MoveArg-1) + "⟩ to"
	case a.MoveArg > 0:
		v = "rm ⟨p" + strconv.Itoa(a.MoveArg-1) + "⟩ from"
	case a.Moves:
		v = "mv"
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
	calleeI int      // the index of the access in the callee's summary
	echo    bool     // a loop's second iteration (events): paired, never summarized
	member  ast.Expr // the one member of a removal of one (removal)
	cleanup bool     // a removal that drops a member a script takes on another path (cleanup.go)
	picked  bool     // a removal of the one member the function's caller named (picked), not one a read found
}

type analysisState struct {
	pass      *analysis.Pass
	ok        map[token.Position]string // lines of //zclaimvet:ok and //zclaimvet:ignore, with the reason
	ignored   map[token.Position]string // those that left a report out
	summaries map[*types.Func]*Summary  // this package's, being computed
	decls     map[*types.Func]*ast.FuncDecl
	watched   map[ast.Node]bool // function bodies run in a WATCH transaction
	final     bool              // the reporting pass
	reported  map[ast.Node]bool
	paired    map[*types.Func]map[int]bool     // callee accesses paired at a call site
	impls     map[*types.Func]*Summary         // interface methods' summaries (summaryOf), nil for none
	polls     map[*types.Named]map[string]bool // keys a type's methods take in one script (scriptPolls)
	origin    map[*types.Func][]ast.Node       // node of each access of this package's summaries
	discarded map[*ast.CallExpr]bool           // calls whose replies are thrown away (discard)
	taken     map[*ast.CallExpr]bool           // calls whose values are assigned or returned (take)
}

func run(pass *analysis.Pass) (any, error) {
	if !uses(pass) {
		return nil, nil
	}
	st := &analysisState{pass: pass, ok: okLines(pass), ignored: map[token.Position]string{}, summaries: map[*types.Func]*Summary{},
		decls: map[*types.Func]*ast.FuncDecl{}, watched: map[ast.Node]bool{}, reported: map[ast.Node]bool{},
		paired: map[*types.Func]map[int]bool{}, impls: map[*types.Func]*Summary{}, polls: map[*types.Named]map[string]bool{}, origin: map[*types.Func][]ast.Node{}, discarded: map[*ast.CallExpr]bool{},
		taken: map[*ast.CallExpr]bool{}}
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
		st.take(f)
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
			if old := st.summaries[fn]; old == nil && (len(s.Accesses) > 0 || s.Sends != nil || s.Lock != "" || s.Unlock || s.Runs != nil) ||
				old != nil && (len(old.Accesses) != len(s.Accesses) || (old.Sends == nil) != (s.Sends == nil) || old.Lock != s.Lock ||
					old.Unlock != s.Unlock || (old.Runs == nil) != (s.Runs == nil)) {
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
		if len(s.Accesses) > 0 || s.Sends != nil || s.Lock != "" || s.Unlock || s.Runs != nil {
			pass.ExportObjectFact(fn, s)
		}
	}
	st.countIgnored()
	return nil, nil
}

// ignoredOut is where each package says how many reviewed sites it left
// out (stderr, as the command's reports).
var ignoredOut io.Writer = os.Stderr

// countIgnored says how many reports the package's ignore and ok comments
// left out, and where: a silenced site stays in sight.
func (st *analysisState) countIgnored() {
	if len(st.ignored) == 0 {
		return
	}
	var lines []string
	for at, why := range st.ignored {
		if why == "" {
			why = "//zclaimvet:ok"
		}
		lines = append(lines, fmt.Sprintf("  %s:%d: %s", filepath.Base(at.Filename), at.Line, why))
	}
	slices.Sort(lines)
	fmt.Fprintf(ignoredOut, "zclaimvet: %s: %d reviewed site(s) left out (//zclaimvet:ignore, //zclaimvet:ok):\n%s\n",
		st.pass.Pkg.Path(), len(lines), strings.Join(lines, "\n"))
}

// claimHere is a racy poller's suggested fix: a comment above the read's
// line that names the one-step claim to put in place of the read and its
// removal (rm at at).
func (st *analysisState) claimHere(read ast.Node, key, rm, at string) []analysis.SuggestedFix {
	tf := st.pass.Fset.File(read.Pos())
	if tf == nil || st.pass.ReadFile == nil {
		return nil
	}
	src, err := st.pass.ReadFile(tf.Name())
	if err != nil {
		return nil
	}
	start := tf.LineStart(tf.Line(read.Pos()))
	off := tf.Offset(start)
	indent := off
	for indent < len(src) && (src[indent] == '\t' || src[indent] == ' ') {
		indent++
	}
	pad := string(src[off:indent])
	text := pad + "// TODO(zclaimvet): this read and the " + rm + " at " + at + " race: take due jobs of " + key +
		" in one step instead,\n" + pad + "// zclaim's `claims, err := broker.Claim(ctx, 100)` (github.com/zclaim/zclaim), " +
		"or one Lua script that reads and removes them (ZRANGEBYSCORE then ZREM inside EVAL).\n"
	return []analysis.SuggestedFix{{Message: "mark the poller with the one-step claim to put here",
		TextEdits: []analysis.TextEdit{{Pos: start, End: start, NewText: []byte(text)}}}}
}

// IsClient reports whether path is the import path of a package of a Redis
// client the analyzer knows (go-redis, redigo, rueidis, valkey-go, radix or
// GoFrame's gredis). Only a package that imports one, directly or through
// other packages, can hold a fact (Uses).
func IsClient(path string) bool {
	return isGoRedis(path) || isRedigo(path) || isRueidis(path) || isRadix(path) || isGoFrame(path)
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

func pos(pass *analysis.Pass, n ast.Node) string {
	p := pass.Fset.Position(n.Pos())
	return filepath.Base(p.Filename) + ":" + strconv.Itoa(p.Line)
}

func line(pass *analysis.Pass, n ast.Node) token.Position {
	p := pass.Fset.Position(n.Pos())
	return token.Position{Filename: p.Filename, Line: p.Line}
}

// okLines returns the lines that carry a "//zclaimvet:ok" comment or a
// "//zclaimvet:ignore reason" one (the reason, "" for ok), and reports an
// ignore without a reason.
func okLines(pass *analysis.Pass) map[token.Position]string {
	out := map[token.Position]string{}
	for _, f := range pass.Files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				p := pass.Fset.Position(c.Pos())
				at := token.Position{Filename: p.Filename, Line: p.Line}
				switch {
				case strings.HasPrefix(c.Text, "//zclaimvet:ok"):
					out[at] = ""
				case strings.HasPrefix(c.Text, "//zclaimvet:ignore"):
					reason := strings.TrimSpace(strings.TrimPrefix(c.Text, "//zclaimvet:ignore"))
					if reason == "" {
						pass.Reportf(c.Pos(), "//zclaimvet:ignore needs a reason: //zclaimvet:ignore <why this site is safe>")
						continue
					}
					out[at] = reason
				}
			}
		}
	}
	return out
}
