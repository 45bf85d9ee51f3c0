# make test: vet every module (the root, zclaimpg, zclaimprom, zclaimotel, zclaimvet,
# cmd/zclaimvet, example and zclaimweb/browser, joined by go.work) and test
# it against a real Redis and PostgreSQL, with -race but for the analyzer's
# packages (NORACE, below). It finds a
# redis-server 7 on PATH, or downloads Debian's package into .cache/redis
# (internal/findredis), and puts it first on PATH; the tests start their
# own servers from it on free ports, or use the server named by
# ZCLAIM_TEST_REDIS=host:port (they never flush it). zclaimpg's tests use
# ZCLAIM_TEST_POSTGRES (a URL), else 127.0.0.1:5432, else a server they start
# from initdb (internal/pgproc), each test in a schema of its own. Output: go test's line
# per package, failed tests' output, and slow tests' progress as it happens.
# -p 3 -parallel 8: most tests wait on servers, not on the 2 cores. The
# packages start in the order MODULES lists them: first the two fault tests,
# which mostly wait for their kills and takeovers, then the packages that
# take longest, so that the short ones fill in at the end. The analyzer's
# packages (NORACE) run beside them without -race: they start no goroutine
# of their own and share no mutable state, and type-checking their test
# programs under -race would cost the machine 2.5 times the CPU.
# GORACE atexit_sleep_ms=0: a race-built binary otherwise sleeps a second
# before it exits, to let a goroutine still running report a race: each
# test binary would hold its slot of -p that second, and each child process
# of one that exits on its own would hold its test back as long.
GO ?= go
SHELL := /bin/bash

# Every module's packages, from the root (go.work joins them), the
# longest first (go test names a package once, where it first comes).
MODULES := ./zclaimpg/internal/pgchaos ./chaos . ./zclaimweb/browser/... ./bench \
	./... ./example/... ./zclaimpg/... ./zclaimprom/... ./zclaimotel/...
NORACE := ./zclaimvet/... ./cmd/zclaimvet/...

.PHONY: test vet fmt
test: vet
	@set -o pipefail; dir=$$($(GO) run ./internal/findredis) || exit 1; \
	$(GO) build -o .cache/testlog ./internal/testlog && \
	{ PATH="$$dir:$$PATH" $(GO) test -count=1 -p 1 -json $(NORACE) > .cache/norace.json 2>&1 & n=$$!; \
	PATH="$$dir:$$PATH" GORACE="atexit_sleep_ms=0 $$GORACE" $(GO) test -race -count=1 -p 3 -parallel 8 -json $(MODULES); \
	r=$$?; wait $$n || r=1; cat .cache/norace.json; exit $$r; } | .cache/testlog

vet:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }
	$(GO) vet $(MODULES) $(NORACE)

fmt:
	gofmt -w .

# make compat: make test's tests but the analyzer's (which start no
# server), run once on Redis 8 and once on Valkey 8: Debian 13's (trixie)
# packages with their own C library, which internal/findredis -dist
# downloads into .cache/redis-trixie and .cache/valkey-trixie the first
# time (about 5 s each; remove a folder to fetch that release's newest).
# ZCLAIM_TEST_REDIS is cleared: every test starts its servers from the one
# under test.
COMPAT := redis valkey
.PHONY: compat
compat:
	@set -o pipefail; $(GO) build -o .cache/testlog ./internal/testlog || exit 1; \
	for s in $(COMPAT); do \
		dir=$$($(GO) run ./internal/findredis -dist trixie -server $$s) || exit 1; \
		PATH="$$dir:$$PATH" ZCLAIM_TEST_REDIS= GORACE="atexit_sleep_ms=0 $$GORACE" \
			$(GO) test -race -count=1 -p 3 -parallel 8 -json $(MODULES) | .cache/testlog "make compat ($$s)" || exit 1; \
	done

# make tidy: go mod tidy in every module. cmd/zclaimvet requires the
# analyzer's module at a version no proxy serves and, so that go install
# path@version takes it, replaces nothing in its go.mod (go.work supplies
# the module, and go mod tidy ignores go.work): its tidy runs with the
# replace added for that run, then dropped.
.PHONY: tidy
tidy:
	@set -e; for m in . zclaimpg zclaimprom zclaimotel zclaimvet example zclaimweb/browser; do \
		(cd $$m && $(GO) mod tidy); done; \
	cd cmd/zclaimvet && $(GO) mod edit -replace=github.com/zclaim/zclaim/zclaimvet=../../zclaimvet && \
	r=0; $(GO) mod tidy || r=$$?; $(GO) mod edit -dropreplace=github.com/zclaim/zclaim/zclaimvet; exit $$r

# make bench: every scenario, side by side, into bench/RESULTS.md (several
# minutes). The tables go to bench/RESULTS.md only once both programs have
# finished: a run that fails leaves the file as it was.
.PHONY: bench
bench:
	@set -o pipefail; rm -f bench/RESULTS.md.new; \
	$(GO) run ./bench | tee bench/RESULTS.md.new && \
	(cd zclaimpg && $(GO) run ./internal/pgbench) | tee -a bench/RESULTS.md.new && \
	(cd zclaimotel && $(GO) run ./internal/otelbench) | tee -a bench/RESULTS.md.new && \
	mv bench/RESULTS.md.new bench/RESULTS.md || { rm -f bench/RESULTS.md.new; exit 1; }

# make chaos: the long fault test (separate processes, SIGKILL/SIGSTOP,
# Redis crash and restart, both appendfsync modes, a failover, a rolling
# deploy with plain asynq servers beside the middleware's, and a Redis
# Cluster with a slot move and two failovers); about 25 minutes. Then
# zclaimpg's: a PostgreSQL sink that does not dedupe, workers SIGKILLed
# every second, Redis restarted from an older RDB snapshot midway, with
# zclaimpg.Complete and without it (the control).
.PHONY: chaos
chaos:
	$(GO) run ./chaos -jobs 50000 -over 150s -kill-every 1s -stop 100s -fsync always,everysec,failover,rolling -cluster
	cd zclaimpg && $(GO) run ./internal/pgchaos -jobs 2000 -over 60s -kill-every 1s
