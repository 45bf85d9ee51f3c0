package zclaimvet

// Hand-offs: a poll that reads due members and hands them on (a push to a
// list or stream, a publish) without removing them, where the members
// leave the set only when another function of the package removes or
// moves them later (a worker's update once it ran the job). Until then
// every poll, on every instance, reads the member again and hands it on
// again.

import (
	"fmt"
	"go/ast"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// HandOffMessage is the report of a hand-off.
const HandOffMessage = "racy poller: %s reads due members of %s here, and %s at %s hands them on without removing " +
	"them; they leave the set only when %s at %s takes them out later, so every poll, on every instance, hands " +
	"the same member on again until then, and the job runs twice. Claim in one script instead: zclaim's " +
	"Broker.Claim, or its Dispatcher into asynq"

// pushCmds hand a member on to the consumers of another key.
var pushCmds = map[string]bool{"LPUSH": true, "RPUSH": true, "LPUSHX": true, "RPUSHX": true, "XADD": true,
	"PUBLISH": true, "SPUBLISH": true}

// handOffs reports, in the final pass, each read among evs (the events of
// body, the body of fn) that pair left unpaired, with no claim and no
// removal of its key after it, whose members body pushes on, while
// another function of the package removes or moves members of that key.
func (st *analysisState) handOffs(fn *types.Func, evs []event, body ast.Node, paired map[int]bool) {
	for j, r := range evs {
		if !r.Read || r.claim || r.Fixed || r.callee != nil || paired[j] || r.group != nil ||
			r.Rank && !scoresRead(evs[j+1:], r.Key) {
			continue
		}
		if slices.ContainsFunc(evs[j+1:], func(e event) bool { return e.claim || !e.Read && !e.Score && e.Key == r.Key }) {
			continue
		}
		push := st.pushOf(r, body)
		if push == nil {
			continue
		}
		rm, at := st.removedElsewhere(fn, r.Key)
		if rm == "" {
			continue
		}
		if st.reported[r.node] {
			continue
		}
		if why, ok := st.ok[line(st.pass, r.node)]; ok {
			st.ignored[line(st.pass, r.node)] = why
			continue
		}
		st.reported[r.node] = true
		key := r.Shown
		if key == "" {
			key = display(r.Key)
		}
		cmd, _ := st.redisCmd(push)
		st.pass.Report(analysis.Diagnostic{Pos: r.node.Pos(),
			Message:        fmt.Sprintf(HandOffMessage, r.Name, key, cmd, pos(st.pass, push), rm, at),
			SuggestedFixes: st.claimHere(r.node, key, rm, at)})
	}
}

// pushOf returns the call in body that pushes a member that read r put in
// its variable (or a value made of one) to a list or stream, or publishes
// it; nil when there is none.
func (st *analysisState) pushOf(r event, body ast.Node) *ast.CallExpr {
	held := st.heldBy(r, body)
	if held == nil {
		return nil
	}
	tainted := st.tainted(body, held)
	var push *ast.CallExpr
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || push != nil {
			return push == nil
		}
		if cmd, _ := st.redisCmd(call); pushCmds[cmd] && slices.ContainsFunc(call.Args, func(a ast.Expr) bool {
			return mentionsMember(st.pass.TypesInfo, tainted, a)
		}) {
			push = call
		}
		return true
	})
	return push
}

// mentionsMember reports whether n mentions one of objs other than by its
// score (a go-redis Z's Score, say: a time to sleep until is no member).
func mentionsMember(info *types.Info, objs map[types.Object]bool, n ast.Node) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			if x.Sel.Name == "Score" {
				return false
			}
		case *ast.Ident:
			if objs[info.ObjectOf(x)] {
				found = true
			}
		}
		return !found
	})
	return found
}

// removedElsewhere returns the removal (or move) of key that a function of
// the package other than fn leaves to its callers, and where it stands:
// the first in source order. A key of a receiver's field counts only in a
// method of the same type; a key made of a parameter, nowhere.
func (st *analysisState) removedElsewhere(fn *types.Func, key string) (name, at string) {
	if strings.HasPrefix(key, "⟨p") {
		return "", ""
	}
	var best *ast.FuncDecl
	for other, s := range st.summaries {
		fd := st.decls[other]
		if other == fn || fd == nil || strings.HasPrefix(key, "⟨r⟩.") && recvNamed(other) != recvNamed(fn) {
			continue
		}
		for _, a := range s.Accesses {
			if !a.Read && !a.Score && a.Key == key && (best == nil || fd.Pos() < best.Pos()) {
				best, name, at = fd, a.Name, a.Pos
			}
		}
	}
	return name, at
}
