package zclaimvet

// GoFrame (gf v2, and v1 before it): its gredis.Redis sends a command by
// name, Do(ctx, "ZREM", key, id) (v1: Do and DoVar, without a context),
// and the sorted-set commands as methods of the group it embeds: ZRange
// (by score with a ZRangeOption{ByScore: true}), ZScore, ZRem,
// ZRemRangeByScore and ZRemRangeByRank; its LPop, RPop and SetNX claim.

import (
	"go/ast"
	"go/constant"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// isGoFrame reports GoFrame's Redis package, v2 and v1.
func isGoFrame(path string) bool {
	return strings.HasPrefix(path, "github.com/gogf/gf/") && strings.HasSuffix(path, "/database/gredis")
}

// goFrameMethod returns the gredis method call calls and the index of its
// first argument after a context, or nil.
func goFrameMethod(pass *analysis.Pass, call *ast.CallExpr) (*types.Func, int) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil, 0
	}
	fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil || !isGoFrame(fn.Pkg().Path()) {
		return nil, 0
	}
	return fn, keyIndex(fn)
}

// goFrameDo returns the arguments of a command sent by name with gredis'
// Do (or v1's DoVar), from the command's name on.
func goFrameDo(pass *analysis.Pass, call *ast.CallExpr) ([]ast.Expr, bool) {
	fn, k := goFrameMethod(pass, call)
	if fn == nil || fn.Name() != "Do" && fn.Name() != "DoVar" || len(call.Args) <= k {
		return nil, false
	}
	return call.Args[k:], true
}

// goFrameEvent reads a sorted-set command sent by a gredis method.
func (st *analysisState) goFrameEvent(s *fnScope, call *ast.CallExpr) (event, bool) {
	if args, ok := goFrameDo(st.pass, call); ok {
		return st.doCommand(s, call, args)
	}
	fn, k := goFrameMethod(st.pass, call)
	if fn == nil || len(call.Args) <= k {
		return event{}, false
	}
	key, rest := call.Args[k], call.Args[k+1:]
	none := func(string) bool { return false }
	switch fn.Name() {
	case "ZRange":
		var opts []ast.Expr
		if len(rest) > 2 {
			opts = rest[2:]
		}
		return st.zsetCommand(s, call, "ZRANGE", key, func(flag string) bool {
			return st.optionSet(opts, map[string]string{"BYSCORE": "ByScore", "WITHSCORES": "WithScores"}[flag])
		}, nil, false)
	case "ZScore":
		return st.zsetCommand(s, call, "ZSCORE", key, none, nil, false)
	case "ZRem":
		return st.zsetCommand(s, call, "ZREM", key, none, rest, call.Ellipsis.IsValid())
	case "ZRemRangeByScore", "ZRemRangeByRank":
		return st.zsetCommand(s, call, strings.ToUpper(fn.Name()), key, none, nil, false)
	}
	return event{}, false
}

// optionSet reports whether one of opts, composite literals of an options
// struct, sets field to the constant true.
func (st *analysisState) optionSet(opts []ast.Expr, field string) bool {
	for _, o := range opts {
		lit, ok := ast.Unparen(o).(*ast.CompositeLit)
		if !ok {
			continue
		}
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			id, ok := kv.Key.(*ast.Ident)
			if !ok || id.Name != field {
				continue
			}
			if tv, ok := st.pass.TypesInfo.Types[kv.Value]; ok && tv.Value != nil && tv.Value.Kind() == constant.Bool &&
				constant.BoolVal(tv.Value) {
				return true
			}
		}
	}
	return false
}
