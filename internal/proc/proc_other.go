//go:build !linux

// Package proc holds process helpers shared by the project's programs and
// by the tests that run them.
package proc

import "os/exec"

// DieWithParent does nothing here: only Linux offers a parent-death signal.
func DieWithParent(*exec.Cmd) {}

// RunAs does nothing here: the tests start servers as another user on Linux only.
func RunAs(*exec.Cmd, int, int) {}
