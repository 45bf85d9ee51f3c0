package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zclaim/zclaim/internal/proc"
)

// The project's two commands install as the docs say, with go install (or
// go run) github.com/zclaim/zclaim/cmd/zclaim@version and
// .../cmd/zclaimvet@version, from a module proxy, outside any workspace:
// this tree's modules, the root and cmd/zclaimvet at a version of the
// test's and the analyzer's at the version cmd/zclaimvet's go.mod
// requires, served from a proxy in a folder (every other module comes from
// the module cache's downloads, else the configured proxy). go install
// refuses a module whose go.mod replaces or excludes a module. The zclaim
// it installs reads a schedule as the one the tests build does; the
// zclaimvet it installs reports a racy poller.
func TestGoInstall(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	proxy := filepath.Join(dir, "proxy")
	const root, version = "github.com/zclaim/zclaim", "v0.0.1"
	publish(t, proxy, root, version, "../..")
	publish(t, proxy, root+"/cmd/zclaimvet", version, "../zclaimvet")
	publish(t, proxy, root+"/zclaimvet", required(t, "../zclaimvet/go.mod", root+"/zclaimvet"), "../../zclaimvet")

	goenv, err := exec.Command("go", "env", "GOMODCACHE", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(strings.TrimSpace(string(goenv)), "\n")
	if len(env) != 2 {
		t.Fatalf("go env GOMODCACHE GOPROXY: %q", goenv)
	}
	// A module cache of its own: the test's versions stay out of the
	// machine's. Its files are read-only; go clean removes them.
	modcache, gobin := filepath.Join(dir, "modcache"), filepath.Join(dir, "bin")
	goEnv := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOSUMDB=off", "GOMODCACHE="+modcache, "GOBIN="+gobin,
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(env[0], "cache", "download"))+","+env[1])
	t.Cleanup(func() {
		clean := exec.Command("go", "clean", "-modcache")
		clean.Env = goEnv
		if out, err := clean.CombinedOutput(); err != nil {
			t.Errorf("go clean -modcache: %v\n%s", err, out)
		}
	})
	for _, cmd := range []string{"zclaim", "zclaimvet"} {
		// -trimpath: the packages' build IDs then do not name this run's
		// module cache, so a later run finds them built.
		install := exec.Command("go", "install", "-trimpath", root+"/cmd/"+cmd+"@"+version)
		install.Dir, install.Env = dir, goEnv
		start := time.Now()
		if out, err := install.CombinedOutput(); err != nil {
			t.Fatalf("go install %s/cmd/%s@%s: %v\n%s", root, cmd, version, err, out)
		}
		t.Logf("go install %s: %v", cmd, time.Since(start))
	}

	_, key := setup(t)
	built, errOut, code := runCLI(t, srv, "stats", "--key", key, "--json")
	want(t, "stats (built)", code, 0, built, errOut)
	stats := exec.Command(filepath.Join(gobin, "zclaim"), "stats", "--key", key, "--json")
	stats.Env = append(os.Environ(), "REDIS_URL=redis://"+srv.Addr+"/0")
	installed, errOut, code, err := proc.Output(stats)
	if err != nil {
		t.Fatal(err)
	}
	want(t, "stats (installed)", code, 0, installed, errOut)
	type counts struct{ Scheduled, Due, Inflight, Dead int }
	var a, b counts
	if json.Unmarshal([]byte(built), &a) != nil || json.Unmarshal([]byte(installed), &b) != nil ||
		a != (counts{Scheduled: 5, Due: 2, Inflight: 1, Dead: 1}) || a != b {
		t.Fatalf("stats from the installed binary:\n%s\nfrom the built one:\n%s", installed, built)
	}

	// A module with a racy poller, on the analyzer's stub of go-redis.
	x := filepath.Join(dir, "x")
	if err := os.MkdirAll(filepath.Join(x, "stub"), 0o755); err != nil {
		t.Fatal(err)
	}
	stub, err := os.ReadFile("../../zclaimvet/testdata/src/github.com/redis/go-redis/v9/redis.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"go.mod": "module x\n\ngo 1.24\n\nrequire github.com/redis/go-redis/v9 v9.0.0\n\n" +
			"replace github.com/redis/go-redis/v9 => ./stub\n",
		"stub/go.mod":   "module github.com/redis/go-redis/v9\n\ngo 1.24\n",
		"stub/redis.go": string(stub),
		"x.go": "package x\n\nimport (\n\t\"context\"\n\n\t\"github.com/redis/go-redis/v9\"\n)\n\n" +
			"func Poll(ctx context.Context, rdb *redis.Client) {\n" +
			"\tfor _, id := range rdb.ZRangeByScore(ctx, \"delay:jobs\", &redis.ZRangeBy{Min: \"-inf\", Max: \"+inf\"}).Val() {\n" +
			"\t\trdb.ZRem(ctx, \"delay:jobs\", id)\n\t}\n}\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(x, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vet := exec.Command(filepath.Join(gobin, "zclaimvet"), "-json", "./...")
	vet.Dir, vet.Env = x, goEnv
	out, err := vet.Output()
	var reports map[string]map[string][]struct{ Message string }
	if jerr := json.Unmarshal(out, &reports); jerr != nil {
		t.Fatalf("the installed zclaimvet: %v, %v\n%s", err, jerr, out)
	}
	if r := reports["x"]["zclaimvet"]; len(r) != 1 || !strings.HasPrefix(r[0].Message, "racy poller") {
		t.Fatalf("the installed zclaimvet reported %+v, want one racy poller", reports)
	}
}

// required returns the version at which the go.mod file gomod requires
// module path.
func required(t *testing.T, gomod, path string) string {
	t.Helper()
	data, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	for s := bufio.NewScanner(bytes.NewReader(data)); s.Scan(); {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(s.Text()), "require "))
		if len(f) >= 2 && f[0] == path {
			return f[1]
		}
	}
	t.Fatalf("%s requires no %s", gomod, path)
	return ""
}

// publish writes version of the module path in dir into proxy, laid out
// as GOPROXY=file://proxy reads it: the zip of every regular file below
// dir but those of other modules (a folder with a go.mod of its own), of
// version control and of the build's cache; its go.mod, info and list.
func publish(t *testing.T, proxy, path, version, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	at := filepath.Join(proxy, filepath.FromSlash(path), "@v") // no upper case in the project's paths to escape
	must(os.MkdirAll(at, 0o755))
	f, err := os.Create(filepath.Join(at, version+".zip"))
	must(err)
	defer f.Close()
	z := zip.NewWriter(f)
	must(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir && (d.Name() == ".git" || d.Name() == ".cache") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); p != dir && err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		w, err := z.Create(path + "@" + version + "/" + filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(w, src)
		return err
	}))
	must(z.Close())
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	must(err)
	must(os.WriteFile(filepath.Join(at, version+".mod"), gomod, 0o644))
	info, err := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC()})
	must(err)
	must(os.WriteFile(filepath.Join(at, version+".info"), info, 0o644))
	// The versions there: go install reads them for the latest's
	// deprecation notice.
	must(os.WriteFile(filepath.Join(at, "list"), []byte(version+"\n"), 0o644))
}
