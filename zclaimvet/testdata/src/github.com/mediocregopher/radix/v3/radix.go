// Package radix is the part of radix v3's API the tests use: commands as
// actions, sent with a client's Do, their replies read into a receiver.
package radix

type Action interface{ Run(Conn) error }

type CmdAction interface{ Action }

type Client interface{ Do(Action) error }

type Conn interface{ Do(Action) error }

func Cmd(rcv interface{}, cmd string, args ...string) CmdAction { return nil }

func FlatCmd(rcv interface{}, cmd, key string, args ...interface{}) CmdAction { return nil }

func WithConn(key string, fn func(Conn) error) Action { return nil }

// EvalScript is a script, made into an action with Cmd.
type EvalScript struct{}

func NewEvalScript(numKeys int, script string) EvalScript { return EvalScript{} }

func (EvalScript) Cmd(rcv interface{}, args ...string) Action { return nil }
