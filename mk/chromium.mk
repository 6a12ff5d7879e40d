# internal/status: the live status page's browser test drives headless
# Chromium (github.com/chromedp/chromedp). `make chromium` installs Debian's
# chromium package when no chromium is on PATH; `make test` runs it first
# through TEST_PREP, and sets KVGATE_REQUIRE_TOOLS so that the test fails,
# not skips, without chromium (a bare `go test` skips it). The test saves its screenshot under
# $(KVGATE_TEST_ARTIFACTS) when set (never committed), its temporary folder
# otherwise.

APT_GET ?= apt-get

TEST_PREP += chromium

.PHONY: chromium
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		{ echo "installing chromium (Debian package) for the status page's browser test"; \
		  $(APT_GET) update && $(APT_GET) install -y chromium; }
