SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c

GO       ?= go
PKGS     ?= ./...
# packages whose tests pin allocation counts, which the race detector would inflate
ALLOCPKGS ?= . ./lua ./middleware
FUZZTIME ?= 20s
# extra flags for the race run of make test, e.g. TESTFLAGS=-json or TESTFLAGS=-v
TESTFLAGS ?=
# The Redis integration tests run in a container of this image. The default is built from
# the host's redis-server by .ci/redis-image.sh (no image registry needed); set
# REDIS_IMAGE=redis:7 to use a pulled one instead.
LOCAL_REDIS_IMAGE := ratebudget-test/redis:local
REDIS_IMAGE ?= $(LOCAL_REDIS_IMAGE)
NOIMAGE := so $(LOCAL_REDIS_IMAGE) is not built (the Redis integration tests will skip and say why)
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test bench demo lint cover fuzz redis-image

## test: vet, then every test with the race detector, then the allocation-count tests
## without it. Where a Docker engine answers, the local Redis image is built first and the
## Redis integration tests run in it; elsewhere they skip and say why.
test:
	$(GO) vet $(PKGS)
	@if [ "$(REDIS_IMAGE)" != "$(LOCAL_REDIS_IMAGE)" ]; then :; \
	elif ! command -v docker >/dev/null 2>&1; then echo "make test: no docker command, $(NOIMAGE)"; \
	elif ! docker info >/dev/null 2>&1; then echo "make test: docker info fails, $(NOIMAGE)"; \
	elif ! command -v redis-server >/dev/null 2>&1; then echo "make test: no redis-server (apt-get install redis-server), $(NOIMAGE)"; \
	else .ci/redis-image.sh "$(LOCAL_REDIS_IMAGE)"; fi
	REDIS_IMAGE="$(REDIS_IMAGE)" TESTCONTAINERS_RYUK_DISABLED="$${TESTCONTAINERS_RYUK_DISABLED:-true}" \
	TESTCONTAINERS_HOST_OVERRIDE="$${TESTCONTAINERS_HOST_OVERRIDE:-localhost}" \
		$(GO) test -race -count=1 -shuffle=on $(TESTFLAGS) $(PKGS)
	$(GO) test -count=1 -run 'Allocs' $(ALLOCPKGS)

## bench: the project's benchmarks, as a table (one package at a time: go test runs
## packages' test binaries in parallel by default, and benchmarks would share the CPUs)
## with -v, so that each benchmark that skips (no redis-server) is listed with its reason
bench:
	$(GO) test -p 1 -v -run '^$$' -bench . -benchmem -count=1 $(PKGS) | $(GO) run ./internal/benchtable

## demo: run the demo server on 127.0.0.1:8080 with the in-memory limiter
demo:
	$(GO) run ./cmd/demo-server

## lint: gofmt, vet, staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

## cover: test coverage summary (HTML in cover.html)
cover:
	$(GO) test -count=1 -coverprofile=cover.out $(PKGS)
	$(GO) tool cover -func=cover.out | tail -1
	$(GO) tool cover -html=cover.out -o cover.html

## fuzz: every fuzz target of every package, FUZZTIME each (the seed corpora also run in make test)
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

## redis-image: build the local Redis image the integration tests use
redis-image:
	.ci/redis-image.sh "$(LOCAL_REDIS_IMAGE)"
