# kvgate — the two commands first: `make run` and `make test`.
GO      ?= go
PKGS    ?= ./...
BENCH   ?= .
# staticcheck, pinned (a version that builds with the module's Go): `go
# install` fetches it through the module proxy without adding it to go.mod
# and builds it once into $(STATICCHECK_BIN) (a git-ignored folder), at the
# start of make test beside the other preparations (test-prep) rather than
# in the lint, after the unit tests.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
STATICCHECK_BIN := $(CURDIR)/.cache/staticcheck/$(subst @,-,$(notdir $(STATICCHECK)))
# Extra `go test` flags for every pass of make test (e.g. TESTFLAGS=-count=1
# to rerun tests whose results are cached).
TESTFLAGS ?=
# Steps that must run before `go test` (fetching reference data, etc.).
# Files in mk/ append to it: `TEST_PREP += my-target`.
TEST_PREP :=
# Slow checks that run after the unit tests and the lint, so that a unit
# failure shows first: `TEST_LAST += my-target`.
TEST_LAST :=
# The non-race passes (lint, allocation tests) build with the Dockerfile's
# settings (static, trimmed paths), so the packages they compile are the
# ones `make static` (the image's binary) compiles: one non-race build of
# the module, not two.
STATIC_ENV := CGO_ENABLED=0 GOFLAGS='-buildvcs=false -trimpath'
# The image's binary, built once by `make static` with the Dockerfile's own
# build line; make test hands it to the tests that run kvgate as a process
# (KVGATE_STATIC_BIN: deploy/validate checks it is static and reads its
# flags) instead of each building its own.
STATIC_BIN := $(CURDIR)/.cache/static/kvgate
# The allocation tests (testing.AllocsPerRun) mean nothing under the race
# detector (sync.Pool drops items at random), so they run in a pass of
# their own without it: every test whose name contains Alloc, in every
# package with a test file that calls testing.AllocsPerRun (found here, so
# no list or build tag to keep up to date; name such tests *Alloc*).
ALLOC_PKGS = $(sort $(dir $(shell find . -name '*_test.go' -not -path './.*' -not -path './deploy/validate/*' | xargs -r grep -l -e 'testing.AllocsPerRun')))

TEST_PREP += staticcheck

-include mk/*.mk

.PHONY: run test test-unit test-alloc bench lint proto build tools fuzz staticcheck

## run: start the whole system locally on embedded defaults (built, then
## run without `go run`, which exits 1 when interrupted: Ctrl-C after a
## clean stop ends make with status 0)
run:
	$(GO) build -o bin/kvgate ./cmd/kvgate
	exec bin/kvgate up

## test: every check, installing what it needs: the unit tests (race
## detector on), the allocation tests (off), the lint, then deploy/'s
## validation. A test whose tool is missing fails instead of skipping
## (KVGATE_REQUIRE_TOOLS).
test: export KVGATE_REQUIRE_TOOLS = 1
test: export KVGATE_STATIC_BIN = $(STATIC_BIN)
test: test-prep test-unit test-alloc lint $(TEST_LAST)
	@echo "make test: every check passed"

# The steps run in the order listed, even under make -j.
.NOTPARALLEL: test

# test-prep: the TEST_PREP steps (downloads, mostly) at once, and beside
# them the module download, the race build of the packages (the unit tests
# then find it in the build cache) and the static binary. -j without a
# number: every step starts at once (the tokenizer data alone is five).
.PHONY: test-prep test-compile static
test-prep:
	@$(MAKE) --no-print-directory -j $(TEST_PREP) test-compile static

test-compile:
	$(GO) mod download
	$(GO) build -race $(PKGS)

test-unit:
	$(GO) test -race -timeout 12m $(TESTFLAGS) $(PKGS)

test-alloc:
	$(if $(ALLOC_PKGS),$(STATIC_ENV) $(GO) test -run Alloc $(TESTFLAGS) $(patsubst %/,%,$(ALLOC_PKGS)),@echo "no allocation tests")

## bench: every hot-path benchmark (figures recorded in BENCHMARKS.md)
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime 2s $(PKGS)

## lint: formatting, vet, staticcheck and consistent import aliases (internal/lint)
lint: staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(STATIC_ENV) $(GO) vet $(PKGS)
	$(STATIC_ENV) $(STATICCHECK_BIN) $(PKGS)
	$(STATIC_ENV) $(GO) run ./internal/lint

# staticcheck: the pinned staticcheck, built once (with the static build's
# settings: the standard library's packages are that build's).
staticcheck: $(STATICCHECK_BIN)

$(STATICCHECK_BIN):
	@mkdir -p $(dir $@)
	$(STATIC_ENV) GOBIN=$(dir $@).tmp $(GO) install $(STATICCHECK)
	mv $(dir $@).tmp/staticcheck $@ && rmdir $(dir $@).tmp

## static: the image's static binary at $(STATIC_BIN), built with the
## Dockerfile's `go build` line (its -o replaced)
static:
	@mkdir -p $(dir $(STATIC_BIN))
	@line=$$(sed -n 's/^RUN \(.*go build .*\)$$/\1/p' Dockerfile | sed 's|-o [^ ]*|-o $(STATIC_BIN)|; s#\(^\| \)go build #\1$(GO) build #'); \
	  [ -n "$$line" ] || { echo "static: no RUN ... go build line in the Dockerfile"; exit 1; }; \
	  echo "$$line"; export GOFLAGS=-buildvcs=false; eval "$$line"

## build: the kvgate binary in ./bin
build:
	$(GO) build -o bin/kvgate ./cmd/kvgate

## fuzz: run each native fuzz target briefly
fuzz:
	@for p in $$($(GO) list $(PKGS)); do for f in $$($(GO) test -list 'Fuzz.*' $$p | grep '^Fuzz'); do $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 10s $$p || exit 1; done; done
