# The two commands: `make run` brings the product up, `make test` runs every
# test against real servers that it starts and stops itself.
GO ?= go
# -p 3: three packages at once on two cores; their long tests mostly wait
# (Kafka sessions, alert windows, failovers), so a third keeps the cores busy.
TESTFLAGS ?= -race -count=1 -timeout 30m -p 3
# The version every binary reports (-version, edgelimit_build_info).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X github.com/edgelimit/edgelimit/internal/boot.Version=$(VERSION) -X github.com/edgelimit/edgelimit/internal/boot.Revision=$(REVISION)

.PHONY: all build test test-short soak bench run stop clean vet

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" ./...

vet:
	$(GO) vet ./...
	cd tools && $(GO) vet ./...

# test starts Redis (standalone + Cluster) and the other servers on free
# loopback ports, runs all tests with -race, and stops the servers; it
# prints what a plain go test prints, then the ten slowest tests
# (internal/testreport). tools/ is a module of its own (repository checks
# with heavy dependencies).
test:
	$(GO) build -o .run/testreport ./internal/testreport
	deploy/local/testenv.sh bash -c 'set -o pipefail; $(GO) test $(TESTFLAGS) -json ./... 2>&1 | .run/testreport && cd tools && $(GO) test $(TESTFLAGS) ./...'

# test-short runs without real servers (they skip).
test-short:
	$(GO) test -count=1 ./...
	cd tools && $(GO) test -count=1 ./...

# soak runs the reference-model tests for longer: the limiter's (TestModel,
# every store) and the gateway's (TestGatewayModel, its paths over a fleet
# of gateways), SOAK (default 2m) per store, against real Redis and Redis
# Cluster. A failure prints EDGELIMIT_MODEL_SEED=... or
# EDGELIMIT_GATEWAY_MODEL_SEED=... to rerun the same rules, phases and costs.
SOAK ?= 2m
soak:
	EDGELIMIT_MODEL_DURATION=$(SOAK) EDGELIMIT_GATEWAY_MODEL_DURATION=$(SOAK) deploy/local/testenv.sh $(GO) test -race -count=1 -timeout 60m -run '^(TestModel|TestGatewayModel)$$' -v ./limiter/ ./gateway/

bench:
	deploy/local/testenv.sh deploy/local/bench.sh

run:
	deploy/local/run.sh

stop:
	deploy/local/run.sh stop

clean: stop
	rm -rf .run
