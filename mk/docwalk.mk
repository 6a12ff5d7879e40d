# internal/docwalk: the test that runs every document's commands. It runs
# the grpcurl calls of README.md and docs/localrouter.md with grpcurl, which
# `make docwalk-tools` installs (a pinned Go module, built once into
# $(DOCWALK_TOOLS), a git-ignored folder); `make test` runs it first through
# TEST_PREP and tells the test where it is, so there a missing grpcurl fails
# the walk instead of leaving those calls out.

GRPCURL_VERSION ?= v1.9.3
DOCWALK_TOOLS   ?= $(CURDIR)/.cache/docwalk/bin

TEST_PREP += docwalk-tools
export KVGATE_DOCWALK_TOOLS := $(DOCWALK_TOOLS)

.PHONY: docwalk-tools
docwalk-tools: $(DOCWALK_TOOLS)/grpcurl-$(GRPCURL_VERSION)

$(DOCWALK_TOOLS)/grpcurl-$(GRPCURL_VERSION):
	mkdir -p $(DOCWALK_TOOLS)
	GOBIN=$(DOCWALK_TOOLS) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
	touch $@
