#!/usr/bin/env bash
# ms/step and tokens/s of the demo model (configs/demo.toml, kv_heads 4 so that tp=4
# splits whole heads) on 4 ranks at tp = 1, 2, 4 against 1 rank, in one run.
#   bench/train_step.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # name, ranks, mesh shape, mesh names
  local name=$1 ranks=$2 shape=$3 names=$4
  sed -e "s/^shape = .*/shape = $shape/" -e "s/^names = .*/names = $names/" \
      -e "s/^kv_heads = .*/kv_heads = 4/" -e "s/^steps = .*/steps = $steps/" \
      -e "s/^log_every = .*/log_every = $((steps / 2))/" configs/demo.toml > "$tmp/$name.toml"
  # The last progress line averages the second half of the run (warm caches).
  local line
  line=$(build/bin/hprun --nproc-per-node "$ranks" build/bin/hp train --config "$tmp/$name.toml" 2>&1 |
         grep -E "^\[rank0\]: step" | tail -1)
  local ms tok
  ms=$(sed -E 's/.* ([0-9.]+) ms\/step.*/\1/' <<< "$line")
  tok=$(sed -E 's/.* ([0-9.]+) tok\/s.*/\1/' <<< "$line")
  printf "%-12s %6d %10.1f %10.0f\n" "$name" "$ranks" "$ms" "$tok"
  echo "$ms" > "$tmp/$name.ms"
  echo "$tok" > "$tmp/$name.tok"
}

printf "%-12s %6s %10s %10s\n" layout ranks "ms/step" "tok/s"
run single 1 "[1]" '["dp"]'
run dp4 4 "[4]" '["dp"]'
run dp2xtp2 4 "[2, 2]" '["dp", "tp"]'
run tp4 4 "[4]" '["tp"]'
base=$(cat "$tmp/single.ms")
for n in dp4 dp2xtp2 tp4; do
  awk -v b="$base" -v c="$(cat "$tmp/$n.ms")" -v n="$n" 'BEGIN { printf "%s: %.2fx the step time of one rank\n", n, c / b }'
done
for n in single dp4 dp2xtp2 tp4; do
  echo "RESULT train_step_ms_$n $(cat "$tmp/$n.ms")"
  echo "RESULT train_step_tokens_per_s_$n $(cat "$tmp/$n.tok")"
done
for n in dp4 dp2xtp2 tp4; do
  awk -v b="$base" -v c="$(cat "$tmp/$n.ms")" -v n="$n" 'BEGIN { printf "RESULT train_step_%s_over_single %.3f\n", n, c / b }'
done
