# e2e/sdk_test.go: the official OpenAI and Anthropic Node SDKs driven
# against `kvgate up` (e2e/testdata/sdk/sdk.mjs).
#
# `make sdk` installs the versions pinned in e2e/testdata/sdk/package.json
# and package-lock.json (openai, @anthropic-ai/sdk) from npm into
# $(SDK_CACHE), a git-ignored folder; `make test` runs it first through
# TEST_PREP and sets KVGATE_REQUIRE_TOOLS (Makefile), under which a missing
# node or SDK fails the test (naming this target) instead of skipping it;
# a missing npm fails this target, and so make test.

SDK_CACHE  ?= .cache/sdk
SDK_SRC    := e2e/testdata/sdk
NPM  ?= npm

TEST_PREP += sdk
export KVGATE_SDK_DIR := $(abspath $(SDK_CACHE))

.PHONY: sdk sdk-clean
sdk: $(SDK_CACHE)/node_modules/.kvgate-stamp

$(SDK_CACHE)/node_modules/.kvgate-stamp: $(SDK_SRC)/package.json $(SDK_SRC)/package-lock.json
	mkdir -p $(SDK_CACHE)
	cp $(SDK_SRC)/package.json $(SDK_SRC)/package-lock.json $(SDK_CACHE)/
	cd $(SDK_CACHE) && $(NPM) ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

sdk-clean:
	rm -rf $(SDK_CACHE)
