// Command testlog reads `go test -json` and prints what `make test` shows:
// go test's own line per package (ok, FAIL, no test files), the output of
// every test that failed, and, as they happen, the lines a slow test marks
// with "progress: " (what it is doing, what it is waiting for). It ends
// with the names of the tests that failed and the last lines of each one's
// output (so that a failure in CI reads without scrolling), then a count
// of the tests, "tests: N passed, N failed", and exits 1 when anything
// failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

const marker = "progress: "

// lastLines is how many lines of a failed test's output the summary at the
// end repeats.
const lastLines = 5

func main() { os.Exit(run(os.Stdin, os.Stdout)) }

// run formats the events of in onto w and returns the exit code.
func run(in io.Reader, w io.Writer) int {
	start := time.Now()
	out := bufio.NewWriter(w)
	flush := func() { out.Flush() }
	buf := map[string][]string{} // output per package/test, until it passes or fails
	passed, failed, failedPkgs := 0, 0, 0
	type failure struct {
		name string
		last []string
	}
	var failures []failure
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			fmt.Fprintln(out, sc.Text()) // a build error, as go printed it
			flush()
			continue
		}
		id := e.Package + " " + e.Test
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
			flush()
		case "output":
			line := e.Output
			if i := strings.Index(line, marker); i >= 0 {
				fmt.Fprintf(out, "  %s: %s", path.Base(e.Package), line[i+len(marker):])
				flush()
				continue
			}
			if e.Test == "" && (strings.HasPrefix(line, "ok  ") || strings.HasPrefix(line, "FAIL\t") || strings.HasPrefix(line, "?   ")) {
				fmt.Fprint(out, line)
				flush()
				continue
			}
			buf[id] = append(buf[id], line)
		case "pass", "skip":
			if e.Test != "" && e.Action == "pass" {
				passed++
			}
			delete(buf, id)
		case "fail":
			if e.Test != "" {
				failed++
				var last []string
				for _, l := range buf[id] {
					if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "=== ") && !strings.HasPrefix(t, "--- ") {
						last = append(last, l)
					}
				}
				failures = append(failures, failure{path.Base(e.Package) + "." + e.Test, last[max(0, len(last)-lastLines):]})
			} else {
				failedPkgs++
			}
			for _, l := range buf[id] {
				fmt.Fprint(out, l)
			}
			delete(buf, id)
			flush()
		}
	}
	// Whatever never finished (a build failure, a crash) is shown as it is.
	for _, lines := range buf {
		for _, l := range lines {
			if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "=== ") {
				fmt.Fprint(out, l)
			}
		}
	}
	if len(failures) > 0 {
		fmt.Fprintf(out, "\nfailed:\n")
		for _, f := range failures {
			fmt.Fprintf(out, "--- %s\n", f.name)
			for _, l := range f.last {
				fmt.Fprint(out, l)
			}
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "make test: %s\n", time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "tests: %d passed, %d failed\n", passed, failed)
	flush()
	if failed > 0 || failedPkgs > 0 {
		return 1
	}
	return 0
}
