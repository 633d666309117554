#!/usr/bin/env bash
# The engine-speed table (ours against vLLM, quiet and beside 2 busy processes, medians of 3) and the
# page it feeds: docs/benchmarks/engine_throughput.md opens with the table of the latest run.
#
#   bench/engine_table.sh reduced   # 80m W1 and tiny W2, both dtypes: est. 20-25 min on a quiet 2-core machine
#   bench/engine_table.sh full      # every size (tiny, 80m, 400m) x workload (W1, W2, azure): hours
#
# Needs the vLLM environment (`make vllm`). Run it when nothing else runs: the busy processes are the
# only load it means to measure under.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-reduced}"
case "$mode" in full|reduced) ;; *) echo "usage: $0 [reduced|full]" >&2; exit 2 ;; esac
out=docs/benchmarks/results/engine_throughput.json
uptime
.venv/bin/python bench/engine_throughput.py --table "$mode" --json "$out.tmp"
mv "$out.tmp" "$out"
.venv/bin/python bench/pages.py --write
uptime
