#!/usr/bin/env bash
# Hierarchical vs flat Gloo all-reduce, all-gather and reduce-scatter across two emulated
# hosts (scripts/emulate_hosts, needs root) of 2 ranks each, every host link limited to
# RATE, sizes 1 MiB .. MAX MiB; prints the machine's load first.
#   bench/hier.sh [max MiB (64)] [rate (1gbit)] [build dir (build)]
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-64} rate=${2:-1gbit} build=${3:-build}
echo "# $(uptime)"
scripts/emulate_hosts --hosts 2 --rate "$rate" -- \
  "$build/bin/hprun" --nnodes 2 --node-rank {node_rank} --master-addr {master_addr} --master-port {master_port} \
  --nproc-per-node 2 "$build/bin/bench_hier" "$max"
