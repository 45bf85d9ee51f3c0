package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	modpath "golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// The command installs as the docs say, with go install (or go run)
// github.com/zclaim/zclaim/cmd/zclaimvet@version, from a module proxy,
// outside any workspace: this tree's cmd/zclaimvet module at a version of
// the test's and the analyzer's module at the version its go.mod
// requires, served from a proxy in a folder (every other module comes
// from the module cache's downloads, else the configured proxy). go
// install refuses a module whose go.mod replaces or excludes a module. The
// binary it installs reports a racy poller.
func TestGoInstall(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	proxy := filepath.Join(dir, "proxy")
	data, err := os.ReadFile("go.mod")
	must(t, err)
	mf, err := modfile.ParseLax("go.mod", data, nil)
	must(t, err)
	const analyzer = "github.com/zclaim/zclaim/zclaimvet"
	version := ""
	for _, r := range mf.Require {
		if r.Mod.Path == analyzer {
			version = r.Mod.Version
		}
	}
	if version == "" {
		t.Fatalf("go.mod requires no %s", analyzer)
	}
	publish(t, proxy, modpath.Version{Path: analyzer, Version: version}, "../../zclaimvet")
	publish(t, proxy, modpath.Version{Path: mf.Module.Mod.Path, Version: "v0.0.1"}, ".")

	goenv, err := exec.Command("go", "env", "GOMODCACHE", "GOPROXY").Output()
	must(t, err)
	env := strings.Split(strings.TrimSpace(string(goenv)), "\n")
	if len(env) != 2 {
		t.Fatalf("go env GOMODCACHE GOPROXY: %q", goenv)
	}
	// A module cache of its own: the test's versions stay out of the
	// machine's. Its files are read-only; go clean removes them.
	modcache, gobin := filepath.Join(dir, "modcache"), filepath.Join(dir, "bin")
	goEnv := append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOSUMDB=off", "GOMODCACHE="+modcache, "GOBIN="+gobin,
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(env[0], "cache", "download"))+","+env[1])
	t.Cleanup(func() {
		clean := exec.Command("go", "clean", "-modcache")
		clean.Env = goEnv
		if out, err := clean.CombinedOutput(); err != nil {
			t.Errorf("go clean -modcache: %v\n%s", err, out)
		}
	})
	// -trimpath: the packages' build IDs then do not name this run's
	// module cache, so a later run finds them built.
	install := exec.Command("go", "install", "-trimpath", mf.Module.Mod.Path+"@v0.0.1")
	install.Dir, install.Env = dir, goEnv
	start := time.Now()
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s@v0.0.1: %v\n%s", mf.Module.Mod.Path, err, out)
	}
	t.Logf("go install: %v", time.Since(start))

	mod := module(t, map[string]string{"x.go": "package x\n\nimport (\n\t\"context\"\n\n\t\"github.com/redis/go-redis/v9\"\n)\n\n" +
		"func Poll(ctx context.Context, rdb *redis.Client) {\n" +
		"\tfor _, id := range rdb.ZRangeByScore(ctx, \"delay:jobs\", &redis.ZRangeBy{Min: \"-inf\", Max: \"+inf\"}).Val() {\n" +
		"\t\trdb.ZRem(ctx, \"delay:jobs\", id)\n\t}\n}\n"})
	run := exec.Command(filepath.Join(gobin, "zclaimvet"), "-json", "./...")
	run.Dir, run.Env = mod, moduleEnv()
	out, err := run.Output()
	var reports map[string]map[string][]struct{ Message string }
	if jerr := json.Unmarshal(out, &reports); jerr != nil {
		t.Fatalf("the installed zclaimvet: %v, %v\n%s", err, jerr, out)
	}
	if r := reports["x"]["zclaimvet"]; len(r) != 1 || !strings.HasPrefix(r[0].Message, "racy poller") {
		t.Fatalf("the installed zclaimvet reported %+v, want one racy poller", reports)
	}
}

// publish writes version v of the module in dir into proxy, a folder laid
// out as GOPROXY=file://proxy reads it.
func publish(t *testing.T, proxy string, v modpath.Version, dir string) {
	t.Helper()
	esc, err := modpath.EscapePath(v.Path)
	must(t, err)
	at := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
	must(t, os.MkdirAll(at, 0o755))
	f, err := os.Create(filepath.Join(at, v.Version+".zip"))
	must(t, err)
	defer f.Close()
	must(t, zip.CreateFromDir(f, v, dir))
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(at, v.Version+".mod"), mod, 0o644))
	info, err := json.Marshal(map[string]any{"Version": v.Version, "Time": time.Now().UTC()})
	must(t, err)
	must(t, os.WriteFile(filepath.Join(at, v.Version+".info"), info, 0o644))
	// The versions there: go install reads them for the latest's
	// deprecation notice.
	must(t, os.WriteFile(filepath.Join(at, "list"), []byte(v.Version+"\n"), 0o644))
}
