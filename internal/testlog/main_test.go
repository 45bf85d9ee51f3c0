package main

import (
	"regexp"
	"strings"
	"testing"
)

// make test's exit code and output come from here: a failed test, a
// failed build or a crashed package fails the run and shows why; progress
// lines show as they come; passing tests stay quiet.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		code     int
		want     []string
		not      []string
	}{
		{"pass", `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"quiet detail\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"progress: waiting for the recoverer\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Output":"ok  \tp\t1.0s\n"}
{"Action":"pass","Package":"p"}`, 0,
			[]string{"  p: waiting for the recoverer", "ok  \tp\t1.0s", "tests: 1 passed, 0 failed"}, []string{"quiet detail"}},
		{"test fails", `{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: wrong answer\n"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t1.0s\n"}
{"Action":"fail","Package":"p"}`, 1,
			[]string{"b_test.go:9: wrong answer", "FAIL\tp", "failed:\n--- p.TestB\n    b_test.go:9: wrong answer\n", "tests: 0 passed, 1 failed"}, nil},
		{"build fails", `{"ImportPath":"p","Action":"build-output","Output":"p/x.go:3:1: syntax error\n"}
{"ImportPath":"p","Action":"build-fail"}
{"Action":"output","Package":"p","Output":"FAIL\tp [build failed]\n"}
{"Action":"fail","Package":"p","FailedBuild":"p"}`, 1,
			[]string{"syntax error", "FAIL\tp [build failed]"}, nil},
		{"package crashes", `{"Action":"output","Package":"p","Output":"panic: boom\n"}
{"Action":"fail","Package":"p"}`, 1,
			[]string{"panic: boom"}, nil},
		// go test's alarm: its panic names the tests still running, but
		// go test may attribute it to a test that had already passed.
		{"package times out", `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"panic: a handler's, recovered and logged\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== CONT  TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"panic: test timed out after 10m0s\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"\trunning tests:\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"\t\tTestHang (10m0s)\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"\n"}
` + strings.Repeat(`{"Action":"output","Package":"p","Test":"TestA","Output":"goroutine 7 [sleep]:\n"}
`, 50) + `{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t600.2s\n"}
{"Action":"fail","Package":"p"}`, 1,
			[]string{"p failed and none of its tests did; its panic and last lines:\npanic: test timed out after 10m0s\n\trunning tests:\n\t\tTestHang (10m0s)\n",
				"--- p (the package: a timeout or a crash)\npanic: test timed out after 10m0s\n\trunning tests:\n\t\tTestHang (10m0s)\n\n",
				"tests: 1 passed, 0 failed"}, []string{"=== CONT"}},
	} {
		var out strings.Builder
		if code := run(strings.NewReader(tc.in), &out, "make compat (valkey)"); code != tc.code {
			t.Errorf("%s: exit %d, want %d\n%s", tc.name, code, tc.code, out.String())
		}
		// The time line, named for the run, just before the count.
		if !regexp.MustCompile(`\nmake compat \(valkey\): \d+s\ntests: `).MatchString(out.String()) {
			t.Errorf("%s: no time line named for the run:\n%s", tc.name, out.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, out.String())
			}
		}
		for _, n := range tc.not {
			if strings.Contains(out.String(), n) {
				t.Errorf("%s: output has %q:\n%s", tc.name, n, out.String())
			}
		}
	}
}
