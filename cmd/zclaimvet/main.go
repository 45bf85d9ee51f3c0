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
	"os"
	"strings"

	"github.com/zclaim/zclaim/zclaimvet"
	"golang.org/x/tools/go/analysis/singlechecker"
)

func main() {
	os.Args = append(os.Args[:1], withoutTests(os.Args[1:])...)
	singlechecker.Main(zclaimvet.Analyzer)
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
