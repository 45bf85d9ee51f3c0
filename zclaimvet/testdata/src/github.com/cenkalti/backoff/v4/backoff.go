// Package backoff stands in for github.com/cenkalti/backoff/v4: the calls
// the analyzer knows.
package backoff

type BackOff interface{}

type Notify func(error, int64)

func Retry(o func() error, b BackOff) error { return o() }

func RetryNotify(o func() error, b BackOff, n Notify) error { return o() }

func RetryWithData[T any](o func() (T, error), b BackOff) (T, error) { return o() }

func NewExponentialBackOff() BackOff { return nil }
