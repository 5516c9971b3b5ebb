SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c

GO       ?= go
PKGS     ?= ./...
# integration_test is a module of its own (so that the library's go.mod does not require
# testcontainers-go): ./... does not enter it, and each target runs ITPKGS there
# (ITPKGS= leaves it out)
ITPKGS   ?= ./...
IT       = $(if $(strip $(ITPKGS)),cd integration_test && )
# test-valkey: the packages whose tests start their own servers, run again on Valkey
VALKEY_SERVER ?= valkey-server
VALKEYPKGS ?= ./lua ./middleware ./cmd/demo-server ./internal/redistest
# and, of the memory package and integration_test, the tests that start a server (the
# container tests of integration_test run on the image built from redis-server only)
VALKEY_MEMORY_RUN ?= Redis$$
VALKEY_IT_RUN ?= Cluster|Stall|Sentinel|KeysShareSlot
# packages whose tests pin allocation counts, which the race detector would inflate
ALLOCPKGS ?= ./memory ./middleware ./lua
FUZZTIME ?= 20s
# extra flags for the race run of make test, e.g. TESTFLAGS=-json or TESTFLAGS=-v
TESTFLAGS ?=
# The Redis integration tests run in a container of this image. The default is built from
# the host's redis-server by .ci/redis-image.sh (no image registry needed); set
# REDIS_IMAGE=redis:7 to use a pulled one instead.
LOCAL_REDIS_IMAGE := ratebudget-test/redis:local
REDIS_IMAGE ?= $(LOCAL_REDIS_IMAGE)
NOIMAGE := so $(LOCAL_REDIS_IMAGE) is not built: the tests in a Redis container (integration_test) will skip
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# the platforms make lint also vets (test files included): 32-bit ints, no Unix signals
PLATFORMS ?= linux/386 linux/arm darwin/arm64 windows/amd64 freebsd/amd64
REDIS_ENV = REDIS_IMAGE="$(REDIS_IMAGE)" TESTCONTAINERS_RYUK_DISABLED="$${TESTCONTAINERS_RYUK_DISABLED:-true}" \
	TESTCONTAINERS_HOST_OVERRIDE="$${TESTCONTAINERS_HOST_OVERRIDE:-localhost}"

# Says what the Redis tests lack before they run (go test prints a skip's reason only with
# -v, and RATEBUDGET_REQUIRE_REDIS=1 makes each skip a failure), and builds the local
# image where a Docker engine answers. TEST_PREP: and what the README's transcripts lack.
define REDIS_PREP
@if [ -z "$${REDIS_SERVER:-}" ] && ! command -v redis-server >/dev/null 2>&1; then \
	echo "make $@: no redis-server (apt-get install redis-server): the tests that start a private redis-server (lua, middleware, cmd/demo-server, integration_test's cluster and Sentinel tests) will skip"; fi
@if [ "$(REDIS_IMAGE)" != "$(LOCAL_REDIS_IMAGE)" ]; then :; \
elif ! command -v docker >/dev/null 2>&1; then echo "make $@: no docker command, $(NOIMAGE)"; \
elif ! docker info >/dev/null 2>&1; then echo "make $@: docker info fails, $(NOIMAGE)"; \
elif ! command -v redis-server >/dev/null 2>&1; then echo "make $@: no redis-server to build the image from, $(NOIMAGE)"; \
else .ci/redis-image.sh "$(LOCAL_REDIS_IMAGE)"; fi
endef
define TEST_PREP
$(REDIS_PREP)
@command -v curl >/dev/null 2>&1 || echo "make $@: no curl (apt-get install curl): the README's transcripts (cmd/demo-server) will skip"
endef

.PHONY: test test-valkey bench demo lint cover fuzz redis-image

## test: vet, then every test with the race detector, then without it the tests it
## cannot run (allocation counts; go-redis's RouteByLatency, which races inside go-redis). Where a Docker engine answers, the local Redis image is built first and the
## Redis integration tests run in it; what the Redis tests lack is said before they run.
test:
	@if [ "$$($(GO) env CGO_ENABLED)" != 1 ]; then \
	echo "make test: the race detector needs cgo, which needs a C compiler (apt-get install gcc)" >&2; exit 1; fi
	$(GO) vet $(PKGS)
	$(if $(IT),$(IT)$(GO) vet $(ITPKGS))
	$(TEST_PREP)
	$(REDIS_ENV) $(GO) test -race -count=1 -shuffle=on $(TESTFLAGS) $(PKGS)
	$(if $(IT),$(IT)$(REDIS_ENV) $(GO) test -race -count=1 -shuffle=on $(TESTFLAGS) $(ITPKGS))
	$(GO) test -count=1 -run 'Allocs' $(ALLOCPKGS)
	$(REDIS_ENV) $(GO) test -count=1 -run 'TestClusterReadsFromReplicas/RouteByLatency' ./lua

## test-valkey: the tests that start their own servers (see VALKEYPKGS), with -race, on
## VALKEY_SERVER instead of redis-server (apt-get install -t bookworm-backports valkey-server)
test-valkey:
	@command -v "$(VALKEY_SERVER)" >/dev/null 2>&1 || { echo "make $@: no $(VALKEY_SERVER) (on Debian 12: apt-get install -t bookworm-backports valkey-server)" >&2; exit 1; }
	@"$(VALKEY_SERVER)" --version
	REDIS_SERVER="$(VALKEY_SERVER)" $(REDIS_ENV) $(GO) test -race -count=1 -shuffle=on $(TESTFLAGS) $(VALKEYPKGS)
	REDIS_SERVER="$(VALKEY_SERVER)" $(REDIS_ENV) $(GO) test -race -count=1 -shuffle=on $(TESTFLAGS) -run '$(VALKEY_MEMORY_RUN)' ./memory
	$(if $(IT),$(IT)REDIS_SERVER="$(VALKEY_SERVER)" $(REDIS_ENV) $(GO) test -race -count=1 -shuffle=on $(TESTFLAGS) -run '$(VALKEY_IT_RUN)' $(ITPKGS))

## bench: the project's benchmarks, as a table (one package at a time: go test runs
## packages' test binaries in parallel by default, and benchmarks would share the CPUs)
## with -v, so that each benchmark that skips (no redis-server) is listed with its reason
bench:
	$(REDIS_PREP)
	{ $(REDIS_ENV) $(GO) test -p 1 -v -run '^$$' -bench . -benchmem -count=1 $(PKGS) && \
	$(if $(IT),$(IT)$(REDIS_ENV) $(GO) test -p 1 -v -run '^$$' -bench . -benchmem -count=1 $(ITPKGS),:); } | $(GO) run ./internal/benchtable

## demo: run the demo server on 127.0.0.1:8080 with the in-memory limiter
demo:
	$(GO) run ./cmd/demo-server

## lint: gofmt (of the files git tracks, or of every .go file outside a git checkout), vet,
## vet on each of PLATFORMS (so that every package and its tests compile there), staticcheck
lint:
	@files=$$(git ls-files '*.go' 2>/dev/null) || files=$$(find . -name '*.go' -not -path './.git/*'); \
	out=$$(gofmt -l $$files); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(if $(IT),$(IT)$(GO) vet $(ITPKGS))
	@for p in $(PLATFORMS); do echo "GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) vet $(PKGS)"; \
	GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) vet $(PKGS) || exit 1; \
	$(if $(IT),( $(IT)GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) vet $(ITPKGS) ) || exit 1;) done
	$(GO) run $(STATICCHECK) $(PKGS)
	$(if $(IT),$(IT)$(GO) run $(STATICCHECK) $(ITPKGS))

## cover: test coverage summary of the library module (HTML in cover.html; integration_test,
## a module of its own, is not counted)
cover:
	$(TEST_PREP)
	$(REDIS_ENV) $(GO) test -count=1 -coverprofile=cover.out $(PKGS)
	$(GO) tool cover -func=cover.out | tail -1
	$(GO) tool cover -html=cover.out -o cover.html

## fuzz: every fuzz target of every package, FUZZTIME each (the seed corpora also run in make test)
## (packages without a Fuzz function in their test files are not built; a package with one
## whose tests do not build is a failure)
fuzz:
	@pkgs=$$($(GO) list -f '{{.ImportPath}} {{.Dir}}' $(PKGS)) || exit 1; n=0; \
	while read -r pkg dir; do \
		grep -qs '^func Fuzz' "$$dir"/*_test.go || continue; \
		list=$$($(GO) test -list '^Fuzz' $$pkg 2>&1 </dev/null) || { echo "$$list"; echo "make fuzz: cannot list the fuzz targets of $$pkg"; exit 1; }; \
		for f in $$(echo "$$list" | grep '^Fuzz'); do \
			echo "== $$pkg $$f"; n=$$((n + 1)); \
			$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$pkg </dev/null || exit 1; \
		done; \
	done <<< "$$pkgs"; \
	echo "make fuzz: $$n fuzz targets, $(FUZZTIME) each"

## redis-image: build the local Redis image the integration tests use
redis-image:
	.ci/redis-image.sh "$(LOCAL_REDIS_IMAGE)"
