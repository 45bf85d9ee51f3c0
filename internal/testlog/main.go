// Command testlog reads `go test -json` and prints what `make test` shows:
// go test's own line per package (ok, FAIL, no test files), the output of
// every test that failed, and, as they happen, the lines a slow test marks
// with "progress: " (what it is doing, what it is waiting for). It ends
// with the names of the tests that failed and the last lines of each one's
// output (so that a failure in CI reads without scrolling; a package that
// failed with no failed test, as a timeout does, shows its own last lines,
// whichever test they came from), then a count
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

// pkgLines is how many of a package's last lines of output, whichever test
// go test attributed them to, are shown when the package fails and none of
// its tests did: a timeout's panic names the tests that were running, and
// it may be attributed to a test that had passed.
const pkgLines = 40

func main() { os.Exit(run(os.Stdin, os.Stdout)) }

// run formats the events of in onto w and returns the exit code.
func run(in io.Reader, w io.Writer) int {
	start := time.Now()
	out := bufio.NewWriter(w)
	flush := func() { out.Flush() }
	buf := map[string][]string{}    // output per package/test, until it passes or fails
	recent := map[string][]string{} // the last pkgLines lines of each package's output
	panics := map[string][]string{} // a package's "panic: …" and what follows it, to the first blank line
	inPanic := map[string]bool{}    // the lines coming belong to panics
	testFailed := map[string]bool{} // packages with a failed test
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
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "=== ") {
				r := append(recent[e.Package], line)
				recent[e.Package] = r[max(0, len(r)-pkgLines):]
			}
			// A timeout's panic lists the tests still running, then a
			// goroutine dump that may be far longer than pkgLines.
			if strings.HasPrefix(line, "panic: ") && len(panics[e.Package]) == 0 {
				inPanic[e.Package] = true
			}
			if inPanic[e.Package] {
				if strings.TrimSpace(line) == "" || len(panics[e.Package]) == pkgLines {
					inPanic[e.Package] = false
				} else {
					panics[e.Package] = append(panics[e.Package], line)
				}
			}
		case "pass", "skip":
			if e.Test != "" && e.Action == "pass" {
				passed++
			}
			if e.Test == "" {
				delete(recent, e.Package)
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
				testFailed[e.Package] = true
			} else {
				failedPkgs++
			}
			for _, l := range buf[id] {
				fmt.Fprint(out, l)
			}
			delete(buf, id)
			if e.Test == "" && !testFailed[e.Package] && len(recent[e.Package]) > 0 {
				// A timeout, a crash or a hung TestMain: the package's
				// panic and last lines say where it was.
				fmt.Fprintf(out, "%s failed and none of its tests did; its panic and last lines:\n", e.Package)
				for _, l := range append(panics[e.Package], recent[e.Package]...) {
					fmt.Fprint(out, l)
				}
				last := panics[e.Package]
				if len(last) == 0 {
					last = recent[e.Package][max(0, len(recent[e.Package])-lastLines):]
				}
				failures = append(failures, failure{path.Base(e.Package) + " (the package: a timeout or a crash)", last})
			}
			delete(recent, e.Package)
			delete(panics, e.Package)
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
