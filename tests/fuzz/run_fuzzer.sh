#!/usr/bin/env bash
# Runs one libFuzzer target for ctest: replays SEEDS (the repo's corpus, read
# only) and fuzzes for SECONDS, writing new inputs and any crasher under WORK.
# Usage: run_fuzzer.sh FUZZER SEEDS WORK SECONDS [libFuzzer flags...]
# A crash, leak, timeout (10 s per input) or out-of-memory exits non-zero and
# leaves WORK/artifacts/crash-* (reproduce with: FUZZER WORK/artifacts/crash-*).
set -euo pipefail
fuzzer=$1 seeds=$2 work=$3 seconds=$4
shift 4
mkdir -p "$work/corpus" "$work/artifacts"
exec "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" "$seeds"
