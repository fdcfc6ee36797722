#!/usr/bin/env bash
# Cost of deterministic mode: ms/step of the demo model (configs/demo.toml, dp=2 x tp=2)
# with train.deterministic off and on, alternating, in one run.
#   bench/determinism.sh [steps] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
rounds=${2:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # deterministic = $1
  sed -e "s/^deterministic = .*/deterministic = $1/" -e "s/^steps = .*/steps = $steps/" \
      -e "s/^log_every = .*/log_every = $((steps / 2))/" configs/demo.toml > "$tmp/run.toml"
  # The last progress line averages the second half of the run (warm caches).
  build/bin/hprun --nproc-per-node 4 build/bin/hp train --config "$tmp/run.toml" 2>&1 |
    grep -E "^\[rank0\]: step" | tail -1 | sed -E 's/.* ([0-9.]+) ms\/step.*/\1/'
}

off=() on=()
for ((r = 0; r < rounds; ++r)); do
  off+=("$(run false)")
  on+=("$(run true)")
done
printf "deterministic  ms/step per round\n"
printf "false          %s\n" "${off[*]}"
printf "true           %s\n" "${on[*]}"
awk -v a="${off[*]}" -v b="${on[*]}" 'BEGIN { n = split(a, x); split(b, y); for (i = 1; i <= n; ++i) { sx += x[i]; sy += y[i] }
  printf "ratio on/off   %.3f\n", sy / sx }'
