#!/usr/bin/env bash
# The estimator against real training on this machine: memory within 10% of the measured
# peak (recompute included), step-time ranking (Spearman) over the strategies of 4 ranks.
# Runs the strategies in turns, `rounds` times, so that drift hits all alike; medians go into the table.
#   bench/plan_validate.sh [rounds] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-6}
bin=build/bin
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

strip() { sed -n 's/^\[rank0\]: //p'; }

for n in 1 2 4; do
  "$bin/hprun" --nproc-per-node "$n" "$bin/bench_plan_validate" calibrate | strip > "$tmp/cluster$n.toml"
done
echo "measured clusters:"; grep -h -E "tflops|bandwidth|latency" "$tmp"/cluster4.toml | sed 's/^/  4 ranks: /'

strategies4=("dp=4" "dp=4,zero=1" "dp=4,zero=3" "dp=2,tp=2" "dp=2,tp=2,zero=3" "tp=4"
             "pp=2,dp=2" "pp=2,dp=2,zero=1" "pp=2,dp=2,zero=2" "pp=2,dp=2,zero=3"
             "dp=4,recompute=selective" "dp=4,recompute=full" "dp=2,tp=2,recompute=selective"
             "pp=2,dp=2,recompute=full")
strategies2=("dp=2" "dp=2,zero=3" "tp=2" "dp=2,recompute=full" "dp=2,recompute=full_chunked" "pp=2"
             "pp=2,recompute=full")
# pp = 2 at 2 ranks too: there each rank has a core of its own, as the estimate's devices
# do; with 4 ranks on 2 cores a stage's idle ranks lend theirs to the busy ones, which
# hides part of the bubble from the measurement.
for ((r = 0; r < rounds; ++r)); do
  for s in "${strategies4[@]}"; do
    "$bin/hprun" --nproc-per-node 4 "$bin/bench_plan_validate" run "$s" "$tmp/cluster4.toml" configs/bench_3m.toml "$steps" | strip >> "$tmp/results.jsonl"
  done
  for s in "${strategies2[@]}"; do
    "$bin/hprun" --nproc-per-node 2 "$bin/bench_plan_validate" run "$s" "$tmp/cluster2.toml" configs/bench_3m.toml "$steps" | strip >> "$tmp/results.jsonl"
  done
done
"$bin/hprun" --nproc-per-node 1 "$bin/bench_plan_validate" run dp=1 "$tmp/cluster1.toml" configs/bench_3m.toml "$steps" | strip >> "$tmp/results.jsonl"
"$bin/bench_plan_validate" summary "$tmp/results.jsonl"
