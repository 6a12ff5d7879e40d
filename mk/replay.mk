.PHONY: replay-results

## replay-results: every engine profile of docs/replay-results.md ("Engines
## the scorer does not know") on the Mooncake and agentic traces at 6x and
## 9x, niced, resumable (OUT, MOONCAKE_REQUESTS, AGENTIC_REQUESTS, LOADS,
## PROFILES, POLICIES: mk/replay-results.sh); prints the markdown table
replay-results: build
	KVGATE=bin/kvgate sh mk/replay-results.sh
