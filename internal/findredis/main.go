// Command findredis is make test's first step: it finds a redis-server 7
// or later on PATH, or in the cache folder .cache/redis, or downloads
// Debian's package into that folder (see internal/redisbin). It says on
// stderr which one the tests use and where it came from, and prints on
// stdout the folder to put first on PATH. It exits 1, with one line that
// names what to install, when none can be had.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/zclaim/zclaim/internal/redisbin"
)

func main() {
	start := time.Now()
	res, err := redisbin.Find(redisbin.Options{
		Path:   os.Getenv("PATH"),
		Cache:  filepath.Join(".cache", "redis"),
		AptGet: "apt-get",
		Log:    func(f string, a ...any) { fmt.Fprintf(os.Stderr, "make test: "+f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "make test: %v\n", err)
		os.Exit(1)
	}
	bin, _ := filepath.Abs(res.Bin)
	from := map[string]string{
		"PATH":       "PATH",
		"cache":      "Debian's package, downloaded earlier into .cache/redis",
		"downloaded": fmt.Sprintf("Debian's package, downloaded into .cache/redis just now (%.1fs)", time.Since(start).Seconds()),
	}[res.Source]
	fmt.Fprintf(os.Stderr, "make test: redis-server %s from %s: %s; the tests start their own servers from it\n", res.Version, from, bin)
	fmt.Println(filepath.Dir(bin))
}
