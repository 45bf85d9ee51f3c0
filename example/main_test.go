package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The example program runs in CI, short: every job handled once, none
// early, none lost. It uses ZCLAIM_EXAMPLE_REDIS_URL if set, else miniredis.
func TestExampleProgram(t *testing.T) {
	var out bytes.Buffer
	code := realMain([]string{"-jobs", "300", "-over", "1s"}, &out, os.Getenv("ZCLAIM_EXAMPLE_REDIS_URL"))
	t.Log("\n" + out.String())
	if code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, want := range []string{
		`handled more than once \(must be 0\) +\| +0 \|`,
		`early starts \(must be 0\) +\| +0 \|`,
		`lost \(must be 0\) +\| +0 \|`,
		`\| handled +\| +305 \|`,
		`crashed claims recovered and run +\| +5 \|`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("output lacks %q", want)
		}
	}
	if first, _, _ := strings.Cut(out.String(), "\n"); !strings.Contains(first, "in-process Redis") && os.Getenv("ZCLAIM_EXAMPLE_REDIS_URL") == "" {
		t.Errorf("first line %q does not say which Redis it uses", first)
	}
}

func TestExampleNaive(t *testing.T) {
	var out bytes.Buffer
	if code := realMain([]string{"-naive", "-jobs", "2000"}, &out, ""); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	t.Log(out.String())
	if !strings.Contains(out.String(), "ran more than once") {
		t.Fatalf("%s", out.String())
	}
}
