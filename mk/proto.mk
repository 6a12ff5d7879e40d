# api/: protobuf of the local-router service. The generated Go is committed,
# so building and testing never need protoc; `make proto` regenerates it.
#
# protoc comes from the system (Debian: protobuf-compiler); the two Go
# plugins are installed at pinned versions into $(PROTO_BIN).

PROTOC                 ?= protoc
PROTO_BIN              ?= $(CURDIR)/.cache/proto/bin
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
PROTO_FILES            := $(shell find api -name '*.proto' 2>/dev/null)

$(PROTO_BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION):
	mkdir -p $(PROTO_BIN)
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	mv $(PROTO_BIN)/protoc-gen-go $@

$(PROTO_BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION):
	mkdir -p $(PROTO_BIN)
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	mv $(PROTO_BIN)/protoc-gen-go-grpc $@

## proto: regenerate api/**/*.pb.go (needs protoc; the output is committed)
proto: $(PROTO_BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION) $(PROTO_BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)
	@command -v $(PROTOC) >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	$(PROTOC) -I . \
		--plugin=protoc-gen-go=$(PROTO_BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION) \
		--plugin=protoc-gen-go-grpc=$(PROTO_BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION) \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		$(PROTO_FILES)
