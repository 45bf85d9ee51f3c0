package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/zclaim/zclaim"
)

var (
	doctorType   *string
	doctorNoType *bool
)

func doctorFlags(fs *flag.FlagSet) {
	doctorType = fs.String("default-type", "", "the dispatchers' DefaultType, which the check of members without a type names")
	doctorNoType = fs.Bool("no-default-type", false, "the dispatchers have no DefaultType: members without a type are a problem")
}

// cmdDoctor runs Broker.Doctor and prints each check, with the fix of
// each problem; it exits 1 when there is one.
func cmdDoctor(ctx context.Context, c *cli, args []string) int {
	if len(args) > 0 {
		fmt.Fprintln(c.errw, "usage: zclaim doctor [--default-type T | --no-default-type]")
		return exitUsage
	}
	store, err := c.store()
	if err != nil {
		return c.fail(err)
	}
	checks, err := c.b.Doctor(ctx, zclaim.DoctorOptions{DefaultType: *doctorType, NoDefaultType: *doctorNoType, Store: store})
	if err != nil {
		return c.fail(err)
	}
	problems := 0
	for _, ch := range checks {
		if ch.Issue != nil {
			problems++
		}
	}
	if c.json {
		c.printJSON(map[string]any{"key": c.key, "checks": checks, "problems": problems})
	} else {
		for _, ch := range checks {
			mark := "ok     "
			if ch.Issue != nil {
				mark = "PROBLEM"
			}
			fmt.Fprintf(c.out, "%s  %-16s %s\n", mark, ch.Check, ch.Result)
			if ch.Issue != nil {
				fmt.Fprintf(c.out, "         %-16s %s\n         %-16s fix: %s\n", "", ch.Issue.Detail, "", ch.Issue.Fix)
			}
		}
		if problems > 0 {
			fmt.Fprintf(c.out, "%d problem(s) with the schedule %s\n", problems, c.key)
		} else {
			fmt.Fprintf(c.out, "the server gives the schedule %s what it needs\n", c.key)
		}
	}
	if problems > 0 {
		return exitPartial
	}
	return exitOK
}

// printLine writes v as one line of JSON.
func (c *cli) printLine(v any) { json.NewEncoder(c.out).Encode(v) }

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
