// Command findredis is make test's first step: it finds a redis-server 7
// or later on PATH, or in the cache folder .cache/redis, or downloads
// Debian's package into that folder (see internal/redisbin). It says on
// stderr which one the tests use and where it came from, and prints on
// stdout the folder to put first on PATH. It exits 1, with one line that
// names what to install, when none can be had.
//
// With -dist (make compat), it looks at nothing on PATH: it takes the
// server -server names ("redis" or "valkey") from that Debian release, in
// the cache folder .cache/<server>-<dist>, downloaded there the first time.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/zclaim/zclaim/internal/redisbin"
)

func main() {
	dist := flag.String("dist", "", "a Debian release (a codename: trixie) to take the server from, instead of PATH")
	server := flag.String("server", "redis", "with -dist: the server, redis or valkey")
	flag.Parse()
	if *server != "redis" && *server != "valkey" {
		fmt.Fprintf(os.Stderr, "findredis: -server %s: want redis or valkey\n", *server)
		os.Exit(2)
	}
	start := time.Now()
	cache, prefix, name, pkg := filepath.Join(".cache", "redis"), "make test: ", "redis-server", "Debian's package"
	opts := redisbin.Options{Path: os.Getenv("PATH"), AptGet: "apt-get"}
	if *dist != "" {
		cache, prefix, name, pkg = filepath.Join(".cache", *server+"-"+*dist), "make compat: ", *server+"-server",
			"Debian "+*dist+"'s package"
		opts.Path, opts.Dist, opts.Server = "", *dist, *server
	}
	opts.Cache = cache
	opts.Log = func(f string, a ...any) { fmt.Fprintf(os.Stderr, prefix+f+"\n", a...) }
	from := map[string]string{
		"PATH":       "PATH",
		"cache":      pkg + ", downloaded earlier into " + cache,
		"downloaded": pkg + ", downloaded into " + cache + " just now",
	}
	res, err := redisbin.Find(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s%v\n", prefix, err)
		os.Exit(1)
	}
	bin, _ := filepath.Abs(res.Bin)
	how := from[res.Source]
	if res.Source == "downloaded" {
		how += fmt.Sprintf(" (%.1fs)", time.Since(start).Seconds())
	}
	fmt.Fprintf(os.Stderr, "%s%s %s from %s: %s; the tests start their own servers from it\n", prefix, name, res.Version, how, bin)
	fmt.Println(filepath.Dir(bin))
}
