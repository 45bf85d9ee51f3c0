package zclaim

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// Every go block in the README is a whole program (the quick start) and
// builds as it stands.
func TestReadmePrograms(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds programs")
	}
	readme, err := os.ReadFile("README.md")
	must(t, err)
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) == 0 {
		t.Fatal("the README has no go block (the quick start)")
	}
	for i, b := range blocks {
		if !bytes.HasPrefix(b[1], []byte("package main\n")) {
			t.Errorf("README go block %d is not a whole program:\n%s", i+1, b[1])
			continue
		}
		// Inside the module, so that it builds against this code; the
		// leading underscore keeps ./... from seeing it meanwhile.
		dir, err := os.MkdirTemp(".", "_readme")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		must(t, os.WriteFile(filepath.Join(dir, "main.go"), b[1], 0o644))
		cmd := exec.Command("go", "build", "-o", os.DevNull, "./"+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("README program %d does not build: %v\n%s\n%s", i+1, err, out, b[1])
		}
	}
}
