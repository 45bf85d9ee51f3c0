package zclaimvet_test

import (
	"testing"

	"github.com/zclaim/zclaim/zclaimvet"
	"golang.org/x/tools/go/analysis/analysistest"
)

// True positives and negatives, with go-redis v9 and v8 and redigo (stubs
// in testdata/src): every "want" comment is reported, nothing else is.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), zclaimvet.Analyzer, "a")
}
