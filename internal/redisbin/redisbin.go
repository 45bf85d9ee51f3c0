// Package redisbin finds a redis-server 7 or later for the tests, or
// obtains one without asking anything of the user: Debian's package,
// downloaded (apt-get download, no root needed) and unpacked into a cache
// folder (dpkg-deb -x), run through a small wrapper that points the loader
// at the libraries unpacked beside it. It can also obtain Redis or Valkey
// from another Debian release than the system's (Options.Dist): that
// release's package lists are fetched into the cache folder, and the
// server runs on the C library of that release, unpacked beside it.
package redisbin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Packages are what Debian's redis-server binary needs beyond libc, libssl
// and libsystemd, which every Debian system has.
var Packages = []string{"redis-tools", "libjemalloc2", "liblzf1", "libatomic1"}

// DistPackages are what a server of another Debian release (Options.Dist)
// needs beyond its tools package: the libraries its binaries load,
// Debian 13's (trixie) names, the C library and its loader included.
var DistPackages = []string{"libc6", "libssl3t64", "libsystemd0", "libjemalloc2", "liblzf1", "libatomic1",
	"libstdc++6", "libgcc-s1", "libcap2", "libgcrypt20", "libgpg-error0", "liblz4-1", "liblzma5", "libzstd1", "zlib1g"}

// Mirror is the Debian archive that another release's packages come from.
const Mirror = "http://deb.debian.org/debian"

// MinMajor is the oldest Redis major version the project supports.
const MinMajor = 7

// Options say where to look.
type Options struct {
	Path   string // the PATH to search; "" for none
	Cache  string // the cache folder for an obtained server
	AptGet string // the apt-get command; "" to not obtain one
	// Dist, when set, is the Debian release (a codename: "trixie") whose
	// server to obtain, with that release's libraries, and Path is not
	// searched; "" for the system's own sources.
	Dist string
	// Server is the server's Debian name: "redis" ("" means it) or, with a
	// Dist, "valkey". Its wrappers are named redis-server and redis-cli
	// either way, as the tests start them.
	Server string
	Log    func(format string, args ...any)
}

// Result is a redis-server that runs.
type Result struct {
	Bin     string // the command to run
	Version string // as it reports it, e.g. "7.0.15"
	Source  string // "PATH", "cache" or "downloaded"
}

// server is the Debian name of the server opts asks for.
func (opts Options) server() string {
	if opts.Server == "" {
		return "redis"
	}
	return opts.Server
}

// ErrNone: no redis-server could be found or obtained.
var ErrNone = errors.New("no redis-server 7 or later: install one (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) or put it on PATH")

// Find returns a redis-server 7 or later: the first on opts.Path (but with
// a Dist), else one in opts.Cache, else one it downloads into opts.Cache.
func Find(opts Options) (Result, error) {
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var tried []string
	path := opts.Path
	if opts.Dist != "" {
		path = "" // a server of that release, whatever PATH holds
	}
	for _, dir := range filepath.SplitList(path) {
		bin := filepath.Join(dir, "redis-server")
		if _, err := os.Stat(bin); err != nil {
			continue
		}
		v, err := version(bin)
		if err == nil {
			return Result{Bin: bin, Version: v, Source: "PATH"}, nil
		}
		tried = append(tried, fmt.Sprintf("%s: %v", bin, err))
	}
	if opts.Cache == "" {
		return Result{}, none(tried)
	}
	wrapper := filepath.Join(opts.Cache, "bin", "redis-server")
	// (A cache without redis-cli was unpacked before it was wrapped too: unpack again.)
	_, cliErr := os.Stat(filepath.Join(opts.Cache, "bin", "redis-cli"))
	if v, err := version(wrapper); err == nil && cliErr == nil {
		return Result{Bin: wrapper, Version: v, Source: "cache"}, nil
	}
	if opts.AptGet == "" {
		return Result{}, none(tried)
	}
	if s := opts.server(); s != "redis" && (s != "valkey" || opts.Dist == "") {
		return Result{}, none(append(tried, fmt.Sprintf("server %q: want redis, or valkey from a Dist", s)))
	}
	aptGet, err := tool(opts.AptGet)
	if err != nil {
		return Result{}, none(append(tried, "apt-get: not found"))
	}
	opts.AptGet = aptGet
	if opts.Dist != "" {
		logf("downloading Debian %s's %s-server into %s", opts.Dist, opts.server(), opts.Cache)
	} else {
		logf("redis-server not on PATH: downloading Debian's package into %s", opts.Cache)
	}
	if err := obtain(opts, logf); err != nil {
		return Result{}, none(append(tried, "download: "+err.Error()))
	}
	v, err := version(wrapper)
	if err != nil {
		return Result{}, none(append(tried, "downloaded server: "+err.Error()))
	}
	return Result{Bin: wrapper, Version: v, Source: "downloaded"}, nil
}

func none(tried []string) error {
	if len(tried) == 0 {
		return ErrNone
	}
	return fmt.Errorf("%w (%s)", ErrNone, strings.Join(tried, "; "))
}

var versionRE = regexp.MustCompile(`v=(\d+)\.(\d+)\.(\d+)`)

// version runs bin --version and checks it is MinMajor or later.
func version(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("unknown version: %s", bytes.TrimSpace(out))
	}
	if major, _ := strconv.Atoi(string(m[1])); major < MinMajor {
		return "", fmt.Errorf("version %s.%s.%s, want %d or later", m[1], m[2], m[3], MinMajor)
	}
	return fmt.Sprintf("%s.%s.%s", m[1], m[2], m[3]), nil
}

// obtain downloads Packages with apt-get into opts.Cache/debs, unpacks them
// into opts.Cache/root and writes the wrapper opts.Cache/bin/redis-server.
func obtain(opts Options, logf func(string, ...any)) error {
	debs := filepath.Join(opts.Cache, "debs")
	root := filepath.Join(opts.Cache, "root")
	os.RemoveAll(debs)
	os.RemoveAll(root)
	for _, d := range []string{debs, root, filepath.Join(opts.Cache, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	pkgs, aptOpts := Packages, []string(nil)
	if opts.Dist != "" {
		var err error
		if aptOpts, err = distLists(opts); err != nil {
			return err
		}
		pkgs = append([]string{opts.server() + "-tools"}, DistPackages...)
	}
	download := func() ([]byte, error) {
		cmd := exec.Command(opts.AptGet, slices.Concat(aptOpts, []string{"download", "-q"}, pkgs)...)
		cmd.Dir = debs
		cmd.Env = sysEnv()
		return cmd.CombinedOutput()
	}
	out, err := download()
	if err != nil && opts.Dist == "" && os.Geteuid() == 0 {
		// The package lists may be missing (a fresh machine): as root,
		// fetch them and try again.
		logf("apt-get download failed; running apt-get update")
		update := exec.Command(opts.AptGet, "update", "-qq")
		update.Env = sysEnv()
		if uout, uerr := update.CombinedOutput(); uerr != nil {
			return fmt.Errorf("apt-get update: %v: %s", uerr, lastLine(uout))
		}
		out, err = download()
	}
	if err != nil {
		return fmt.Errorf("apt-get download: %v: %s", err, lastLine(out))
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(files) == 0 {
		return fmt.Errorf("apt-get download left no .deb files")
	}
	for _, f := range files {
		dpkgDeb, err := tool("dpkg-deb")
		if err != nil {
			return err
		}
		cmd := exec.Command(dpkgDeb, "-x", f, root)
		cmd.Env = sysEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v: %s", filepath.Base(f), err, lastLine(out))
		}
	}
	// The server runs through its own name: a symlink to redis-check-rdb
	// (in redis-tools; valkey-check-rdb in valkey-tools), which picks its
	// mode by the name it was called by, as Debian's server package has it.
	name := opts.server()
	server := filepath.Join(root, "usr", "bin", name+"-server")
	if _, err := os.Stat(filepath.Join(root, "usr", "bin", name+"-check-rdb")); err != nil {
		return fmt.Errorf("the packages hold no usr/bin/%s-check-rdb", name)
	}
	if _, err := os.Lstat(server); err != nil {
		if err := os.Symlink(name+"-check-rdb", server); err != nil {
			return err
		}
	}
	var libs []string
	for _, pat := range []string{"usr/lib/*-linux-gnu", "lib/*-linux-gnu", "usr/lib", "lib"} {
		m, _ := filepath.Glob(filepath.Join(root, pat))
		libs = append(libs, m...)
	}
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	for i := range libs {
		libs[i] = abs(libs[i])
	}
	// The system's loader and C library run a binary of the system's
	// release; one of another release runs on that release's, through its
	// loader.
	run := "LD_LIBRARY_PATH='" + strings.Join(libs, ":") + "'${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "
	if opts.Dist != "" {
		loaders, _ := filepath.Glob(filepath.Join(root, "usr", "lib", "*-linux-gnu", "ld-linux*.so.*"))
		if len(loaders) == 0 {
			return fmt.Errorf("the packages hold no loader (usr/lib/*-linux-gnu/ld-linux*.so.*)")
		}
		run = "exec '" + abs(loaders[0]) + "' --library-path '" + strings.Join(libs, ":") + "' --argv0 \"$0\" "
	}
	// redis-server, and redis-cli beside it (the tests join clusters with it).
	for wrapper, bin := range map[string]string{"redis-server": server, "redis-cli": filepath.Join(root, "usr", "bin", name+"-cli")} {
		script := "#!/bin/sh\n# " + filepath.Base(bin) + " unpacked from Debian's packages (internal/redisbin).\n" +
			run + "'" + abs(bin) + "' \"$@\"\n"
		if err := os.WriteFile(filepath.Join(opts.Cache, "bin", wrapper), []byte(script), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// distLists fetches the package lists of opts.Dist (its main component,
// from Mirror, checked against the system's Debian keyrings) into
// opts.Cache/apt, and returns the options that make apt-get read them
// instead of the system's.
func distLists(opts Options) ([]string, error) {
	dir, err := filepath.Abs(filepath.Join(opts.Cache, "apt"))
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	sources := filepath.Join(dir, "sources.list")
	if err := os.WriteFile(sources, []byte("deb "+Mirror+" "+opts.Dist+" main\n"), 0o644); err != nil {
		return nil, err
	}
	aptOpts := []string{
		"-o", "Dir::Etc::SourceList=" + sources, "-o", "Dir::Etc::SourceParts=/dev/null",
		"-o", "Dir::State::Lists=" + filepath.Join(dir, "lists"), "-o", "Dir::Cache=" + filepath.Join(dir, "cache"),
		"-o", "Acquire::Languages=none",
	}
	// Only the Packages lists: no translations, no AppStream metadata.
	for _, t := range []string{"DEP-11", "DEP-11-icons", "DEP-11-icons-small", "DEP-11-icons-hidpi", "CNF"} {
		aptOpts = append(aptOpts, "-o", "Acquire::IndexTargets::deb::"+t+"::DefaultEnabled=false")
	}
	update := exec.Command(opts.AptGet, append(aptOpts, "update", "-qq")...)
	update.Env = sysEnv()
	if out, err := update.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get update of %s: %v: %s", opts.Dist, err, lastLine(out))
	}
	return aptOpts, nil
}

// tool finds a system command on PATH, or in /usr/bin or /bin when PATH
// leaves those out.
func tool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if filepath.IsAbs(name) {
		return "", fmt.Errorf("%s not found", name)
	}
	for _, dir := range []string{"/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// sysEnv is the environment for apt-get and dpkg-deb, which run further
// system commands (tar, gpgv) by name: the system folders are on its PATH.
func sysEnv() []string {
	return append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/sbin:/usr/bin:/sbin:/bin")
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
