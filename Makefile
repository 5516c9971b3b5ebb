SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c

GO       ?= go
PKGS     ?= ./...
# packages whose tests pin allocation counts, which the race detector would inflate
ALLOCPKGS ?= ./lua ./middleware
FUZZTIME ?= 20s
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test bench demo lint cover fuzz redis-image

## test: vet, then every test with the race detector (Redis tests need Docker; see README),
## then the allocation-count tests without it
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -shuffle=on $(PKGS)
	$(GO) test -count=1 -run 'Allocs' $(ALLOCPKGS)

## bench: the project's benchmarks, as a table (one package at a time: go test runs
## packages' test binaries in parallel by default, and benchmarks would share the CPUs)
bench:
	$(GO) test -p 1 -run '^$$' -bench . -benchmem -count=1 $(PKGS) | $(GO) run ./internal/benchtable

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
	.ci/redis-image.sh
