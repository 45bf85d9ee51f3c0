// Package proc holds process helpers shared by the project's programs and
// by the tests that run them.
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

// RunAs makes a child process run as uid and gid.
func RunAs(cmd *exec.Cmd, uid, gid int) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}
