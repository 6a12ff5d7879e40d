#!/bin/sh
# replay-results.sh: every engine profile of issue 25 (matched, engines 2x
# slower, 2x faster, half the pool 2x slower, 20 % noise, --speedup 0.5 and
# 2 with a matched scorer) on the Mooncake synthetic trace and a generated
# agentic trace, at 6x and 9x load, for round-robin, dynamo, llm-d and the
# kvgate policies this binary knows; then one markdown table
# (docs/replay-results.md, "Engines the scorer does not know").
#
#   make replay-results                      # everything, resumable
#   OUT=/tmp/rr MOONCAKE_REQUESTS=2000 make replay-results
#
# Each run writes OUT/<trace>-<load>-<profile>.json (kvgate replay
# --json-out) and is skipped when that file exists, so an interrupted run
# resumes; TABLE_ONLY=1 prints the table of the files there without
# running anything. Runs are niced: the replay is CPU-bound and single-threaded.
set -eu
KVGATE=${KVGATE:-bin/kvgate}
OUT=${OUT:-.cache/replay-results}
TRACE=${TRACE:-../shared/traces/mooncake_synthetic_trace.jsonl}
MOONCAKE_REQUESTS=${MOONCAKE_REQUESTS:-0}   # 0: the whole trace
AGENTIC_REQUESTS=${AGENTIC_REQUESTS:-1500}
TRACES=${TRACES:-"mooncake agentic"}
LOADS=${LOADS:-"6 9"}
PROFILES=${PROFILES:-"matched slow2x fast2x halfslow noise20 speedup0.5 speedup2"}
POLICIES=${POLICIES:-round-robin,dynamo,llm-d,kvgate}
mkdir -p "$OUT"

# The kvgate policies of issue 25 this binary has (kvgate-static and
# kvgate-oracle come with online calibration, kvgate-hist with the
# histograms' samples; kvgate-auto, the measured externality, is shown
# beside the default on every profile).
for p in kvgate-static kvgate-oracle kvgate-hist kvgate-auto; do
	if "$KVGATE" replay --generate agentic --max-requests 1 --policies "$p" >/dev/null 2>&1; then
		case ",$POLICIES," in *",$p,"*) ;; *) POLICIES="$POLICIES,$p" ;; esac
	fi
done

profile_flags() {
	case "$1" in
	matched) ;;
	slow2x) echo "--engine-speeds 0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5" ;;
	fast2x) echo "--engine-speeds 2,2,2,2,2,2,2,2" ;;
	halfslow) echo "--engine-speeds 1,1,1,1,0.5,0.5,0.5,0.5" ;;
	noise20) echo "--engine-noise 0.2" ;;
	speedup0.5) echo "--speedup 0.5" ;;
	speedup2) echo "--speedup 2" ;;
	*) echo "unknown profile $1" >&2; exit 2 ;;
	esac
}

for trace in $TRACES; do
	for load in $LOADS; do
		for prof in $PROFILES; do
			f="$OUT/$trace-${load}x-$prof.json"
			[ -s "$f" ] || [ -n "${TABLE_ONLY:-}" ] && continue
			if [ "$trace" = mooncake ]; then
				src="--trace $TRACE --max-requests $MOONCAKE_REQUESTS"
			else
				src="--generate agentic --max-requests $AGENTIC_REQUESTS"
			fi
			echo "$(date -u +%H:%M:%S) $trace ${load}x $prof (load average $(cut -d' ' -f1 /proc/loadavg))" >&2
			# shellcheck disable=SC2046,SC2086
			nice -n 19 "$KVGATE" replay $src --rate "$load" --policies "$POLICIES" \
				--workers 8 $(profile_flags "$prof") --json-out "$f.tmp" >/dev/null
			mv "$f.tmp" "$f"
		done
	done
done

# The table: each policy's TTFT mean and p99 (ms), hit ratio, its ratio
# to the capacity oracle, and mean and p99 as fractions of dynamo's.
echo "| trace | load | profile | policy | TTFT mean | p99 | hit | / capacity oracle | mean / dynamo | p99 / dynamo |"
echo "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for trace in $TRACES; do
	for load in $LOADS; do
		for prof in $PROFILES; do
			f="$OUT/$trace-${load}x-$prof.json"
			[ -s "$f" ] && jq -e .results >/dev/null 2>&1 <"$f" || continue
			jq -r --arg t "$trace" --arg l "${load}x" --arg p "$prof" '
				(.results[] | select(.policy == "dynamo") | .ttft_ms) as $d
				| .results[]
				| "| \($t) | \($l) | \($p) | \(.policy) | \(.ttft_ms.mean | round) | \(.ttft_ms.p99 | round) | \(.hit_ratio * 1000 | round / 1000) | \(.hit_vs_capacity_oracle * 1000 | round / 1000) | \(if $d.mean > 0 then (.ttft_ms.mean / $d.mean * 100 | round / 100) else "-" end) | \(if $d.p99 > 0 then (.ttft_ms.p99 / $d.p99 * 100 | round / 100) else "-" end) |"' "$f"
		done
	done
done
