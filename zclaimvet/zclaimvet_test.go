package zclaimvet_test

import (
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
	analysistest.Run(t, analysistest.TestData(), zclaimvet.Analyzer, "a", "wrap", "b", "rwrap", "c", "tnone", "ru", "rx", "gf")
}

// With -tests, test files are analysed too.
func TestAnalyzerTests(t *testing.T) {
	if err := zclaimvet.Analyzer.Flags.Set("tests", "true"); err != nil {
		t.Fatal(err)
	}
	defer zclaimvet.Analyzer.Flags.Set("tests", "false")
	analysistest.Run(t, analysistest.TestData(), zclaimvet.Analyzer, "twith")
}
