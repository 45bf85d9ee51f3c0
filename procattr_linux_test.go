package zclaim

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a child process get SIGKILL when the test process
// dies, even if it dies without cleaning up (a fuzz worker, a crash).
func dieWithParent(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
