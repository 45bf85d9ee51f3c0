// Package proc holds process helpers shared by the project's programs.
package proc

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes a child process get SIGKILL when its parent dies,
// even if the parent is killed before it can clean up.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
