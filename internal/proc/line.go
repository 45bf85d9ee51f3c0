package proc

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"time"
)

// FirstLine reads the first line a child process prints on out, without
// its newline, and gives up after within: a test whose child hangs before
// it prints fails instead of hanging. The reader it returns holds the
// rest of out.
func FirstLine(out io.Reader, within time.Duration) (string, *bufio.Reader, error) {
	r := bufio.NewReader(out)
	type read struct {
		line string
		err  error
	}
	got := make(chan read, 1)
	go func() {
		line, err := r.ReadString('\n')
		got <- read{strings.TrimSuffix(line, "\n"), err}
	}()
	select {
	case g := <-got:
		return g.line, r, g.err
	case <-time.After(within):
		return "", r, fmt.Errorf("no line in %v", within)
	}
}
