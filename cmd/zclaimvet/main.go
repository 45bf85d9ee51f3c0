// Command zclaimvet reports racy sorted-set pollers: a read of due members
// and a removal of them, sent as separate requests (see package zclaimvet).
//
//	go run github.com/zclaim/zclaim/cmd/zclaimvet@latest ./...
//
// It skips test files, and loads packages without them, so that a package
// whose tests do not build is analysed all the same; -tests analyses them
// too. As a vet tool (go vet -vettool=PATH), go vet drops every package
// whose test files do not type-check, and a -vettool path that does not
// exist makes go vet run its own checks and exit 0: run it on its own.
package main

import (
	"encoding/json"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/zclaim/zclaim/zclaimvet"
	"golang.org/x/tools/go/analysis/singlechecker"
)

func main() {
	if len(os.Args) >= 2 && noFacts(os.Args[len(os.Args)-1]) {
		return
	}
	os.Args = append(os.Args[:1], withoutTests(os.Args[1:])...)
	singlechecker.Main(zclaimvet.Analyzer)
}

// vetConfig is the part of go vet's per-package configuration (the .cfg
// file it passes) that noFacts reads.
type vetConfig struct {
	ImportPath  string
	ImportMap   map[string]string // import path → the package's path
	Standard    map[string]bool   // the standard library's packages among the imports
	PackageVetx map[string]string // an import's path → its facts file
	VetxOnly    bool              // only the package's facts are asked for
	VetxOutput  string            // where they go
}

// noFacts answers go vet's call (its flags, then the .cfg file) for the
// facts of a dependency that cannot have any, without type-checking it: it
// writes the empty facts file and reports true. Such a package is no Redis
// client's, and none of its imports is a client or has facts: an import
// that reaches a client has at least its zclaimvet.Uses fact, and the
// standard library imports no client. go vet asks for the facts of every
// package that a vetted one depends on: most of them reach no client, and
// type-checking them from source would be most of a cold run's time. Any
// other call, or a configuration it cannot read, goes to the analyzer.
//
// It does so only where the vetx files of the golang.org/x/tools linked in
// hold facts alone (factsOnlyVetx): from v0.50.0 they also hold each
// package's types, which the analyzer reads for the packages that import
// it, and which only type-checking the package gives.
func noFacts(arg string) bool {
	if !vetxFactsOnly || !strings.HasSuffix(arg, ".cfg") {
		return false
	}
	data, err := os.ReadFile(arg)
	var cfg vetConfig
	if err != nil || json.Unmarshal(data, &cfg) != nil || !cfg.VetxOnly || cfg.VetxOutput == "" ||
		zclaimvet.IsClient(cfg.ImportPath) {
		return false
	}
	for _, p := range cfg.ImportMap {
		if cfg.Standard[p] || p == "unsafe" || p == "C" {
			continue
		}
		if zclaimvet.IsClient(p) || cfg.PackageVetx[p] == "" {
			return false
		}
		if fi, err := os.Stat(cfg.PackageVetx[p]); err != nil || fi.Size() > 0 {
			return false
		}
	}
	return os.WriteFile(cfg.VetxOutput, nil, 0o666) == nil
}

// vetxFactsOnly: the vetx files of the unitchecker linked in hold facts
// alone, so that an empty one says a package has none.
var vetxFactsOnly = factsOnlyVetx(linkedTools())

// linkedTools returns the version of golang.org/x/tools the command was
// built with (that of its replacement, where go.mod replaces it), or "".
func linkedTools() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range bi.Deps {
		if d.Path != "golang.org/x/tools" {
			continue
		}
		if d.Replace != nil {
			return d.Replace.Version
		}
		return d.Version
	}
	return ""
}

// factsOnlyVetx reports whether golang.org/x/tools at version v (a module
// version, pseudo-versions included) writes vetx files that hold facts
// alone: before v0.50.0. Any version it cannot read is taken for a later
// one.
func factsOnlyVetx(v string) bool {
	minor, ok := strings.CutPrefix(v, "v0.")
	if !ok {
		return false
	}
	minor, _, _ = strings.Cut(minor, ".")
	n, err := strconv.Atoi(minor)
	return err == nil && n < 50
}

// withoutTests adds -test=false (load no test files) to a command line
// that sets neither -test nor -tests, unless go vet runs the tool (a .cfg
// file, -V, -flags).
func withoutTests(args []string) []string {
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "test" || name == "tests" || name == "V" || name == "flags") ||
			strings.HasSuffix(a, ".cfg") {
			return args
		}
	}
	return append([]string{"-test=false"}, args...)
}
