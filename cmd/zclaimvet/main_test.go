package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// go vet -vettool with the built analyzer: over the root module and the
// example's it reports the example's -naive poller (racy), and the
// benchmark's and the migration example's checked pollers (milder), and
// nothing else: nothing in zclaim itself; over asynq's and go-redis'
// sources it reports nothing.
func TestVetTool(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("vets asynq and go-redis")
	}
	bin := tool(t)
	vet := func(pkgs ...string) (string, time.Duration) {
		start := time.Now()
		cmd := exec.Command("go", append([]string{"vet", "-vettool=" + bin}, pkgs...)...)
		cmd.Dir = "../.."
		out, _ := cmd.CombinedOutput() // exit 1 when it reports
		// A fresh module cache downloads the test dependencies of what
		// it vets; those lines are go's, not the analyzer's.
		kept := regexp.MustCompile(`(?m)^go: downloading .*\n`).ReplaceAll(out, nil)
		return string(kept), time.Since(start)
	}

	out, took := vet("./...", "./example/...")
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^(\S+\.go):\d+:\d+: (racy poller|checked ZREM|poller under a lock)`).FindAllStringSubmatch(out, -1) {
		got = append(got, filepath.ToSlash(m[1])+": "+m[2])
	}
	sort.Strings(got)
	want := []string{"bench/claim.go: checked ZREM", "example/main.go: racy poller", "example/migrate/main.go: checked ZREM"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("go vet ./... ./example/... reported %q, want %q:\n%s", got, want, out)
	}
	t.Logf("this module: %v", took)

	out, took = vet("github.com/hibiken/asynq/...", "github.com/redis/go-redis/v9/...")
	if strings.TrimSpace(out) != "" {
		t.Fatalf("reports in asynq or go-redis:\n%s", out)
	}
	t.Logf("asynq and go-redis (30 packages): %v", took)
}

// A package whose test file does not build: zclaimvet on its own still
// reports the poller in it (it loads no test files), where go vet
// -vettool drops the package.
func TestTestsDoNotBuild(t *testing.T) {
	t.Parallel()
	bin := tool(t)
	dir := module(t, map[string]string{
		"x.go": `package x

import (
	"context"

	"github.com/redis/go-redis/v9"
)

func Poll(rdb *redis.Client) []string {
	ids := rdb.ZRangeByScore(context.Background(), "delay:jobs", &redis.ZRangeBy{Max: "+inf"}).Val()
	rdb.ZRem(context.Background(), "delay:jobs", ids)
	return ids
}
`,
		"x_test.go": "package x\n\nfunc TestBroken(t *testing.T) { undefined() }\n",
	})
	cmd := exec.Command(bin, "./...")
	cmd.Dir, cmd.Env = dir, moduleEnv()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 || !strings.Contains(string(out), "x.go:10:9: racy poller") {
		t.Fatalf("zclaimvet ./... over a package whose tests do not build: %v\n%s", err, out)
	}
	cmd = exec.Command("go", "vet", "-vettool="+bin, "./...")
	cmd.Dir, cmd.Env = dir, moduleEnv()
	out, _ = cmd.CombinedOutput()
	if strings.Contains(string(out), "racy poller") || !strings.Contains(string(out), "undefined") {
		t.Fatalf("go vet -vettool was expected to stop at the test file's type error:\n%s", out)
	}
}

// noFacts answers go vet's call for a dependency's facts itself only
// where the package cannot have any: it is no Redis client's, and each of
// its imports is the standard library's or has an empty facts file. Every
// other call goes to the analyzer and leaves the facts file alone.
func TestNoFacts(t *testing.T) {
	t.Parallel()
	std := map[string]bool{"context": true, "fmt": true, "unsafe": true}
	// Facts files by name: "empty", "facts" (an import that has facts),
	// "gone" (none there).
	vetx := func(files ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(files); i += 2 {
			m[files[i]] = files[i+1]
		}
		return m
	}
	for _, c := range []struct {
		name string
		cfg  vetConfig
		want bool
	}{
		{"standard imports", vetConfig{ImportPath: "net/http", ImportMap: map[string]string{"context": "context", "fmt": "fmt"}, VetxOnly: true}, true},
		{"no imports", vetConfig{ImportPath: "github.com/google/uuid/x", VetxOnly: true}, true},
		{"unsafe and cgo", vetConfig{ImportPath: "x", ImportMap: map[string]string{"unsafe": "unsafe", "C": "C"}, VetxOnly: true}, true},
		{"an import without facts", vetConfig{ImportPath: "b", ImportMap: map[string]string{"fmt": "fmt", "wrap": "example.com/wrap"},
			PackageVetx: vetx("example.com/wrap", "empty"), VetxOnly: true}, true},
		{"an import with facts", vetConfig{ImportPath: "b", ImportMap: map[string]string{"fmt": "fmt", "wrap": "example.com/wrap"},
			PackageVetx: vetx("example.com/wrap", "facts"), VetxOnly: true}, false},
		{"an import whose facts file is not named", vetConfig{ImportPath: "b", ImportMap: map[string]string{"wrap": "example.com/wrap"}, VetxOnly: true}, false},
		{"an import whose facts file is gone", vetConfig{ImportPath: "b", ImportMap: map[string]string{"wrap": "example.com/wrap"},
			PackageVetx: vetx("example.com/wrap", "gone"), VetxOnly: true}, false},
		{"a vendored import with facts", vetConfig{ImportPath: "b", ImportMap: map[string]string{"fmt": "example.com/vendor/fmt"},
			PackageVetx: vetx("example.com/vendor/fmt", "facts"), VetxOnly: true}, false},
		{"a client among the imports", vetConfig{ImportPath: "b", ImportMap: map[string]string{"redis": "github.com/redis/go-redis/v9"},
			PackageVetx: vetx("github.com/redis/go-redis/v9", "empty"), VetxOnly: true}, false},
		{"go-redis itself", vetConfig{ImportPath: "github.com/redis/go-redis/v9/internal/proto", ImportMap: map[string]string{"fmt": "fmt"}, VetxOnly: true}, false},
		{"redigo itself", vetConfig{ImportPath: "github.com/gomodule/redigo/redis", ImportMap: map[string]string{"fmt": "fmt"}, VetxOnly: true}, false},
		{"a package vetted for its reports", vetConfig{ImportPath: "net/http", ImportMap: map[string]string{"fmt": "fmt"}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "facts"), []byte("facts"), 0o644))
			for p, name := range c.cfg.PackageVetx {
				c.cfg.PackageVetx[p] = filepath.Join(dir, name)
			}
			c.cfg.Standard, c.cfg.VetxOutput = std, filepath.Join(dir, "vet.out")
			must(t, os.WriteFile(c.cfg.VetxOutput, []byte("earlier"), 0o644))
			data, err := json.Marshal(c.cfg)
			must(t, err)
			cfg := filepath.Join(dir, "vet.cfg")
			must(t, os.WriteFile(cfg, data, 0o644))
			if !vetxFactsOnly {
				c.want = false // x/tools' vetx files hold types too: every call type-checks
			}
			if got := noFacts(cfg); got != c.want {
				t.Fatalf("noFacts = %v, want %v", got, c.want)
			}
			out, err := os.ReadFile(c.cfg.VetxOutput)
			must(t, err)
			if want := map[bool]string{true: "", false: "earlier"}[c.want]; string(out) != want {
				t.Fatalf("facts file %q, want %q", out, want)
			}
		})
	}
	for _, arg := range []string{"./...", filepath.Join(t.TempDir(), "missing.cfg")} {
		if noFacts(arg) {
			t.Fatalf("noFacts(%q) = true", arg)
		}
	}
}

// Which golang.org/x/tools versions write vetx files of facts alone.
func TestFactsOnlyVetx(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		"v0.38.0": true, "v0.49.0": true, "v0.49.1-0.20260101000000-0123456789ab": true, "v0.9.0": true,
		"v0.50.0": false, "v0.52.0": false, "v0.50.1-0.20260101000000-0123456789ab": false,
		"v1.0.0": false, "(devel)": false, "": false, "v0.x.0": false,
	} {
		if got := factsOnlyVetx(v); got != want {
			t.Errorf("factsOnlyVetx(%q) = %v, want %v", v, got, want)
		}
	}
	if v := linkedTools(); v == "" {
		t.Fatal("no golang.org/x/tools in the build info")
	}
}

// Under a real go vet, over a package x that imports the standard
// library's fmt, a package plain of the module that imports only another
// (leaf, which imports fmt), and a package through that imports one (uses)
// that imports go-redis: the tool answers the calls for the facts of fmt,
// leaf and plain without type-checking them, and type-checks uses,
// through and x. Where the vetx files of the x/tools linked in hold types
// too (vetxFactsOnly false), it type-checks every package, and each
// facts file it writes is one the unitchecker reads.
func TestNoFactsUnderGoVet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A tool of its own build ID, so that go vet makes the calls instead
	// of answering them from an earlier run's cache.
	bin := buildTool(t, dir, "-ldflags=-X=main.build="+strconv.FormatInt(time.Now().UnixNano(), 10))
	// A wrapper that keeps each call's arguments and .cfg file, named by
	// its process id: go vet makes calls in parallel.
	calls := filepath.Join(dir, "calls")
	must(t, os.MkdirAll(calls, 0o755))
	wrapper := filepath.Join(dir, "wrapper")
	must(t, os.WriteFile(wrapper, []byte("#!/bin/sh\n"+
		"echo \"$@\" > "+calls+"/$$.args\n"+
		"for a in \"$@\"; do case \"$a\" in *.cfg) cp \"$a\" "+calls+"/$$.cfg;; esac; done\n"+
		"exec "+bin+" \"$@\"\n"), 0o755))
	mod := module(t, map[string]string{
		"x.go":         "package x\n\nimport (\n\t\"fmt\"\n\n\t\"x/plain\"\n\t\"x/through\"\n)\n\nfunc F() { fmt.Println(plain.F(), through.F()) }\n",
		"leaf/leaf.go": "package leaf\n\nimport \"fmt\"\n\nfunc F() string { return fmt.Sprint(1) }\n",
		"plain/p.go":   "package plain\n\nimport \"x/leaf\"\n\nfunc F() string { return leaf.F() }\n",
		"uses/u.go":    "package uses\n\nimport \"github.com/redis/go-redis/v9\"\n\nvar Client *redis.Client\n",
		"through/t.go": "package through\n\nimport \"x/uses\"\n\nfunc F() any { return uses.Client }\n",
	})
	// -work keeps go vet's work directory, where the facts files it
	// names are.
	cmd := exec.Command("go", "vet", "-work", "-vettool="+wrapper, ".")
	cmd.Dir, cmd.Env = mod, moduleEnv()
	out, err := cmd.CombinedOutput()
	if m := regexp.MustCompile(`(?m)^WORK=(.+)$`).FindSubmatch(out); m != nil {
		t.Cleanup(func() { os.RemoveAll(string(m[1])) })
	}
	if err != nil {
		t.Fatalf("go vet: %v\n%s", err, out)
	}
	cfgs, err := filepath.Glob(filepath.Join(calls, "*.cfg"))
	must(t, err)
	answered := map[string]bool{"fmt": true, "x/leaf": true, "x/plain": true, "x/uses": false, "x/through": false, "x": false}
	seen := map[string]bool{}
	for _, f := range cfgs {
		args, err := os.ReadFile(strings.TrimSuffix(f, ".cfg") + ".args")
		must(t, err)
		if !strings.HasSuffix(strings.TrimSpace(string(args)), ".cfg") {
			t.Fatalf("go vet called the tool with %q: not its .cfg last", args)
		}
		data, err := os.ReadFile(f)
		must(t, err)
		var cfg vetConfig
		must(t, json.Unmarshal(data, &cfg))
		want, ok := answered[cfg.ImportPath]
		if !ok {
			continue
		}
		// The call again, with its .cfg: its output files in a new place,
		// and no export data of its imports, so that only a call answered
		// without type-checking succeeds.
		var raw map[string]any
		must(t, json.Unmarshal(data, &raw))
		tmp := t.TempDir()
		vetx := filepath.Join(tmp, "vet.out")
		raw["VetxOutput"], raw["Stdout"], raw["PackageFile"] = vetx, filepath.Join(tmp, "vet.stdout"), map[string]string{}
		data, err = json.Marshal(raw)
		must(t, err)
		must(t, os.WriteFile(f, data, 0o644))
		argv := strings.Fields(string(args))
		argv[len(argv)-1] = f
		msg, err := exec.Command(bin, argv...).CombinedOutput()
		facts, ferr := os.ReadFile(vetx)
		seen[cfg.ImportPath] = true
		if !vetxFactsOnly {
			// Its imports' types come from their vetx files, which the
			// call still has: it type-checks, whatever the package.
			if cfg.VetxOnly && (err != nil || ferr != nil || !bytes.HasPrefix(facts, []byte("vetx"))) {
				t.Errorf("go vet's call for the facts of %s (%s): %v, facts %.20q (%v)\n%s", cfg.ImportPath, argv, err, facts, ferr, msg)
			}
			continue
		}
		if want && (err != nil || ferr != nil || len(facts) != 0) {
			t.Errorf("go vet's call for the facts of %s (%s): %v, facts %q (%v)\n%s", cfg.ImportPath, argv, err, facts, ferr, msg)
		}
		if !want && err == nil {
			t.Errorf("go vet's call for %s (VetxOnly %v) was answered without type-checking it:\n%s", cfg.ImportPath, cfg.VetxOnly, msg)
		}
	}
	for p := range answered {
		if !seen[p] {
			t.Errorf("go vet made no call for %s among its %d", p, len(cfgs))
		}
	}
}

// buildTool builds the command into dir, with go build's flags.
func buildTool(t *testing.T, dir string, flags ...string) string {
	t.Helper()
	bin := filepath.Join(dir, "zclaimvet")
	if out, err := exec.Command("go", append(append([]string{"build"}, flags...), "-o", bin, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

var toolOnce struct {
	sync.Once
	dir string
	err error
}

// tool builds the command once for the tests that share it, into a folder
// of the system's temporary folder named after this one, where it is kept:
// go build relinks it only when something it is built from changed.
func tool(t *testing.T) string {
	t.Helper()
	toolOnce.Do(func() {
		wd, err := os.Getwd()
		if err != nil {
			toolOnce.err = err
			return
		}
		sum := sha256.Sum256([]byte(wd))
		toolOnce.dir = filepath.Join(os.TempDir(), "zclaim-bin", hex.EncodeToString(sum[:8]))
		toolOnce.err = os.MkdirAll(toolOnce.dir, 0o755)
	})
	if toolOnce.err != nil {
		t.Fatal(toolOnce.err)
	}
	return buildTool(t, toolOnce.dir)
}

// module writes a module x of files, beside a stub of go-redis (the
// analyzer's testdata) that it requires, and returns its directory.
func module(t *testing.T, files map[string]string) string {
	t.Helper()
	stub, err := os.ReadFile("../../zclaimvet/testdata/src/github.com/redis/go-redis/v9/redis.go")
	must(t, err)
	files["go.mod"] = "module x\n\ngo 1.24\n\nrequire github.com/redis/go-redis/v9 v9.0.0\n\n" +
		"replace github.com/redis/go-redis/v9 => ./stub\n"
	files["stub/go.mod"] = "module github.com/redis/go-redis/v9\n\ngo 1.24\n"
	files["stub/redis.go"] = string(stub)
	dir := t.TempDir()
	for name, body := range files {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	return dir
}

// moduleEnv is the environment of a command over a module of module's:
// offline, outside the workspace.
func moduleEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
