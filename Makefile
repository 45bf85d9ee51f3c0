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
