# The two commands: `make run` brings the product up, `make test` runs every
# test against real servers that it starts and stops itself.
GO ?= go
TESTFLAGS ?= -race -count=1 -timeout 30m

.PHONY: all build test test-short bench run stop clean vet

all: build

build:
	$(GO) build ./...

vet:
	$(GO) vet ./...

# test starts Redis (standalone + Cluster) and the other servers on free
# loopback ports, runs all tests with -race, and stops the servers.
test:
	deploy/local/testenv.sh $(GO) test $(TESTFLAGS) ./...

# test-short runs without real servers (they skip).
test-short:
	$(GO) test -count=1 ./...

bench:
	deploy/local/testenv.sh deploy/local/bench.sh

run:
	deploy/local/run.sh

stop:
	deploy/local/run.sh stop

clean: stop
	rm -rf .run
