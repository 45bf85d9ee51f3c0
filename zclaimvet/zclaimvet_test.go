package zclaimvet_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/zclaim/zclaim/zclaimvet"
	"golang.org/x/tools/go/analysis/analysistest"
)

// Every shape of poller, each with its twin (stubs of go-redis v9, v8, v7
// and v5, redigo, rueidis, radix v3 and errgroup in testdata/src): every
// "want" comment is reported, nothing else is. Package b polls through
// package wrap's methods, so its reports come from wrap's facts; tnone's
// test file is skipped; ru polls through rueidis, rx through radix.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), zclaimvet.Analyzer, "a", "wrap", "b", "rwrap", "c", "tnone", "ru", "rx", "gf",
		"layered/queue/naive", "layered/queue/counted", "layered/service")
}

// With -tests, test files are analysed too.
func TestAnalyzerTests(t *testing.T) {
	if err := zclaimvet.Analyzer.Flags.Set("tests", "true"); err != nil {
		t.Fatal(err)
	}
	defer zclaimvet.Analyzer.Flags.Set("tests", "false")
	analysistest.Run(t, analysistest.TestData(), zclaimvet.Analyzer, "twith")
}

// A site marked //zclaimvet:ignore with a reason (on the read's line or
// the removal's) is left out and counted, with its reason, on the
// package's line of output; a mark without a reason is reported and
// silences nothing.
func TestIgnore(t *testing.T) {
	var out bytes.Buffer
	old := *zclaimvet.IgnoredOut
	*zclaimvet.IgnoredOut = &out
	defer func() { *zclaimvet.IgnoredOut = old }()
	analysistest.Run(t, analysistest.TestData(), zclaimvet.Analyzer, "ign")
	for _, want := range []string{"zclaimvet: ign: 2 reviewed site(s) left out",
		"ign.go:15: one replica runs this, under the deploy's leader lease", "ign.go:23: a dev-only tool"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// A racy poller's report suggests the one-step claim, as a comment above
// the read (zclaimvet -fix -diff).
func TestSuggestedFix(t *testing.T) {
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), zclaimvet.Analyzer, "fix")
}
