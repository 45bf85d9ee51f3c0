// Package radix is radix v3 as it was imported before modules, without
// /v3: the part of its API the tests use.
package radix

type Action interface{ Run(Conn) error }

type Client interface{ Do(Action) error }

type Conn interface{ Do(Action) error }

func Cmd(rcv interface{}, cmd string, args ...string) Action { return nil }
