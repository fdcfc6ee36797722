#!/usr/bin/env bash
# Cost of the precision monitor on the demo run (configs/demo.toml, dp = 2 x tp = 2, 4
# ranks): blocks of 10 steps of one model, alternately bare and watched at every = 10
# (norms, non-finite check, replica check, spikes, a file), in one job (bench/monitor.cpp).
# Prints RESULT monitor_overhead: a watched block of 10 steps over a bare one, from medians.
#   bench/monitor.sh [rounds] [every]
set -euo pipefail
cd "$(dirname "$0")/.."
build/bin/hprun --nproc-per-node 4 build/bin/bench_monitor configs/demo.toml "${1:-20}" "${2:-10}" 2>&1 |
  sed -E 's/^\[rank0\]: //' | grep -vE '^\[rank[1-9]'
