#!/usr/bin/env bash
# Global tokens/s of `hp train` (data parallel) against plain PyTorch DDP
# (bench/ddp_baseline.py, Debian's python3-torch) on the same 3.03M-parameter model,
# per-rank batch 8 x 256 tokens, at 2 and 4 Gloo ranks, in one run.
#   bench/compare_ddp.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
./scripts/setup --bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf "%-6s %12s %12s %7s\n" ranks "ddp tok/s" "hp tok/s" ratio
for ranks in 2 4; do
  sed -e "s/^shape = .*/shape = [$ranks]/" -e "s/^batch = .*/batch = $((8 * ranks))/" \
      -e "s/^steps = .*/steps = $steps/" -e "s/^log_every = .*/log_every = 1/" \
      configs/bench_3m.toml > "$tmp/hp.toml"
  ddp=$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/ddp_baseline.py --ranks "$ranks" --steps "$steps" |
        sed -E 's/.* ([0-9]+) tok\/s/\1/')
  # Both sides: the median step time of the second half of the run as global tokens/s (a
  # progress line per step, the number before "ms/step"; the upper median, as the
  # baseline takes it).
  ours=$(build/bin/hprun --nproc-per-node "$ranks" build/bin/hp train --config "$tmp/hp.toml" 2>&1 |
         grep -E "^\[rank0\]: step" | awk -v half=$((steps / 2)) '$3 >= half { print $(NF - 3) }' | sort -g |
         awk -v tokens=$((8 * ranks * 256)) '{ ms[NR] = $1 } END { print tokens / (ms[int(NR / 2) + 1] / 1000) }')
  awk -v r="$ranks" -v d="$ddp" -v o="$ours" 'BEGIN { printf "%-6s %12.0f %12.0f %6.2fx\n", r, d, o, o / d }'
done
