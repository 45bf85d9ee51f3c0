// Package retry stands in for github.com/avast/retry-go: the calls the
// analyzer knows.
package retry

type Option func()

func Do(f func() error, opts ...Option) error { return f() }

func DoWithData[T any](f func() (T, error), opts ...Option) (T, error) { return f() }
