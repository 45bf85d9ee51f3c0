package proc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Build builds the main package in the current folder (a test's own) as a
// binary named name in a new temporary folder; remove deletes that folder.
func Build(name string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "zclaim-"+name+"-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, name)
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// Output runs cmd to its end and returns what it printed on stdout and
// stderr and its exit code; err is for a command that could not be run.
func Output(cmd *exec.Cmd) (stdout, stderr string, code int, err error) {
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code, err = ee.ExitCode(), nil
	}
	return o.String(), e.String(), code, err
}

// TestMain is the TestMain of a command's tests that run it as a built
// binary, which starts its own redis-server: it checks that redis-server
// is on PATH, builds the main package in the current folder as name into
// *bin, calls run (testing.M's Run), removes the binary and exits with
// run's code. A part it cannot find fails the tests with one line.
func TestMain(name string, bin *string, run func() int) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Fprintf(os.Stderr, "the %s command's tests need redis-server 7 on PATH (make test finds or fetches one)\n", name)
		os.Exit(2)
	}
	b, remove, err := Build(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	*bin = b
	code := run()
	remove()
	os.Exit(code)
}

// Fataler is the part of a *testing.T that Run uses.
type Fataler interface {
	Helper()
	Fatal(args ...any)
}

// Run runs bin with args in folder dir ("" for the current one) and
// returns what it printed and its exit code; t fails when it cannot run.
func Run(t Fataler, dir, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	stdout, stderr, code, err := Output(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return stdout, stderr, code
}
