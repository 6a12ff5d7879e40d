# kvgate — the two commands first: `make run` and `make test`.
GO      ?= go
PKGS    ?= ./...
BENCH   ?= .
# staticcheck, pinned (a version that builds with the module's Go); `go run`
# fetches it through the module proxy without adding it to go.mod.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Steps that must run before `go test` (fetching reference data, etc.).
# Files in mk/ append to it: `TEST_PREP += my-target`.
TEST_PREP :=

-include mk/*.mk

.PHONY: run test bench lint proto build tools fuzz

## run: start the whole system locally on embedded defaults (built, then
## run without `go run`, which exits 1 when interrupted: Ctrl-C after a
## clean stop ends make with status 0)
run:
	$(GO) build -o bin/kvgate ./cmd/kvgate
	exec bin/kvgate up

## test: every test, race detector on, installing what it needs
test: $(TEST_PREP)
	$(GO) mod download
	$(GO) vet $(PKGS)
	$(GO) test -race -timeout 12m $(PKGS)

## bench: every hot-path benchmark (figures recorded in BENCHMARKS.md)
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime 2s $(PKGS)

## lint: formatting, vet, staticcheck and consistent import aliases (internal/lint)
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)
	$(GO) run ./internal/lint

## build: the kvgate binary in ./bin
build:
	$(GO) build -o bin/kvgate ./cmd/kvgate

## fuzz: run each native fuzz target briefly
fuzz:
	@for p in $$($(GO) list $(PKGS)); do for f in $$($(GO) test -list 'Fuzz.*' $$p | grep '^Fuzz'); do $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 10s $$p || exit 1; done; done
