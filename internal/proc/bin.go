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
