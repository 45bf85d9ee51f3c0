# make test: vet and race-test everything against a real Redis. The tests
# start their own redis-server from PATH on a free port, or use the server
# named by ZCLAIM_TEST_REDIS=host:port (they never flush it).
GO ?= go

.PHONY: test vet fmt
test: vet
	$(GO) test -race -count=1 ./...

vet:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

fmt:
	gofmt -w .

# make bench: every scenario, side by side, into bench/RESULTS.md (several minutes).
.PHONY: bench
bench:
	$(GO) run ./bench | tee bench/RESULTS.md

# make chaos: the long fault test (separate processes, SIGKILL/SIGSTOP,
# Redis crash and restart, both appendfsync modes); several minutes.
.PHONY: chaos
chaos:
	$(GO) run ./chaos -jobs 50000 -over 150s -kill-every 1s -stop 100s -fsync always,everysec,failover
