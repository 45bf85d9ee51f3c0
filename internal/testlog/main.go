// Command testlog reads `go test -json` and prints what `make test` shows:
// go test's own line per package (ok, FAIL, no test files), the output of
// every test that failed, and, as they happen, the lines a slow test marks
// with "progress: " (what it is doing, what it is waiting for). It ends
// with the names of the tests that failed and the last lines of each one's
// output (so that a failure in CI reads without scrolling; a package that
// failed with no failed test, as a timeout does, shows its own last lines,
// whichever test they came from), then the run's time, named by its one
// optional argument ("make test: 1m18s" by default), and a count of the
// tests, "tests: N passed, N failed", and exits 1 when anything failed.
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

// pkgOut is what a package's output shows should it fail with no failed
// test: its last pkgLines lines, whichever test go test attributed them
// to, and its last "panic: …" with the lines after it up to the first
// blank one (a timeout's list of running tests, ahead of a goroutine dump
// longer than pkgLines).
type pkgOut struct {
	recent, panic []string
	inPanic       bool // the lines coming belong to panic
	testFailed    bool // one of its tests failed, and shows for it
}

func (p *pkgOut) add(line string) {
	if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "=== ") {
		r := append(p.recent, line)
		p.recent = r[max(0, len(r)-pkgLines):]
	}
	if strings.HasPrefix(line, "panic: ") {
		p.panic, p.inPanic = nil, true
	}
	if p.inPanic {
		if strings.TrimSpace(line) == "" || len(p.panic) == pkgLines {
			p.inPanic = false
		} else {
			p.panic = append(p.panic, line)
		}
	}
}

func main() {
	name := "make test"
	if len(os.Args) > 1 {
		name = os.Args[1]
	}
	os.Exit(run(os.Stdin, os.Stdout, name))
}

// run formats the events of in onto w, the time line naming the run name,
// and returns the exit code.
func run(in io.Reader, w io.Writer, name string) int {
	start := time.Now()
	out := bufio.NewWriter(w)
	flush := func() { out.Flush() }
	buf := map[string][]string{} // output per package/test, until it passes or fails
	// What a package that fails with no failed test shows (pkgOut).
	pkgs := map[string]*pkgOut{}
	pkg := func(name string) *pkgOut {
		p := pkgs[name]
		if p == nil {
			p = &pkgOut{}
			pkgs[name] = p
		}
		return p
	}
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
			pkg(e.Package).add(line)
		case "pass", "skip":
			if e.Test != "" && e.Action == "pass" {
				passed++
			}
			if e.Test == "" {
				delete(pkgs, e.Package)
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
				pkg(e.Package).testFailed = true
			} else {
				failedPkgs++
			}
			for _, l := range buf[id] {
				fmt.Fprint(out, l)
			}
			delete(buf, id)
			if p := pkgs[e.Package]; e.Test == "" && p != nil && !p.testFailed && len(p.recent) > 0 {
				// A timeout, a crash or a hung TestMain: the package's
				// panic and last lines say where it was.
				fmt.Fprintf(out, "%s failed and none of its tests did; its panic and last lines:\n", e.Package)
				for _, l := range append(p.panic, p.recent...) {
					fmt.Fprint(out, l)
				}
				last := p.panic
				if len(last) == 0 {
					last = p.recent[max(0, len(p.recent)-lastLines):]
				}
				failures = append(failures, failure{path.Base(e.Package) + " (the package: a timeout or a crash)", last})
			}
			if e.Test == "" {
				delete(pkgs, e.Package)
			}
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
	fmt.Fprintf(out, "%s: %s\n", name, time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "tests: %d passed, %d failed\n", passed, failed)
	flush()
	if failed > 0 || failedPkgs > 0 {
		return 1
	}
	return 0
}
