#!/usr/bin/env bash
# Global tokens/s of `hp train` with pipeline stages against data parallelism alone on the
# same 4 ranks: the 3.03M-parameter Llama of configs/bench_3m.toml, 8 x 256 tokens per rank
# and step, dp = 4 against pp = 2 x dp = 2 with 1F1B (4 and 8 microbatches), under hprun.
# Rounds alternate the contenders, in an order reversed from one round to the next; each
# figure is the median step time of the second half of a run, the RESULT the median over
# rounds of the ratio to dp = 4 in the same round.
#   bench/train_pipeline.sh [steps] [rounds]       (defaults 20 and 3)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
rounds=${2:-3}
bin=${HP_BUILD:-build}/bin
[ -x "$bin/hp" ] && [ -x "$bin/hprun" ] || { echo "train_pipeline.sh: build first (no $bin/hp)" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seq=$(sed -n 's/^seq = \([0-9]*\).*/\1/p' configs/bench_3m.toml)

layout() {  # name shape names microbatches
  sed -e "s/^shape = .*/shape = $2/" -e "s/^names = .*/names = $3/" -e "s/^batch = .*/batch = 32/" \
      -e "s/^steps = .*/steps = $steps/" -e "s/^log_every = .*/log_every = 1/" configs/bench_3m.toml > "$tmp/$1.toml"
  [ "$4" = 0 ] || printf '\n[pipeline]\nschedule = "1f1b"\nmicrobatches = %s\n' "$4" >> "$tmp/$1.toml"
}
layout dp4 "[4]" '["dp"]' 0
layout pp2_dp2_m4 "[2, 2]" '["pp", "dp"]' 4
layout pp2_dp2_m8 "[2, 2]" '["pp", "dp"]' 8

run() {  # name -> global tokens/s
  "$bin/hprun" --nproc-per-node 4 "$bin/hp" train --config "$tmp/$1.toml" > "$tmp/log" 2>&1 ||
    { tail -20 "$tmp/log" >&2; return 1; }
  grep -E "^\[rank0\]: step" "$tmp/log" | awk -v half=$((steps / 2)) '$3 >= half { print $(NF - 3) }' | sort -g |
    awk -v tokens=$((32 * seq)) '{ ms[NR] = $1 } END { print tokens / (ms[int(NR / 2) + 1] / 1000) }'
}

echo "# bench/train_pipeline.sh: $steps steps, $rounds round(s), $(getconf _NPROCESSORS_ONLN) cores," \
     "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tools || echo +changes), $(date -u '+%F %T') UTC"
order=(dp4 pp2_dp2_m4 pp2_dp2_m8)
for ((round = 1; round <= rounds; round++)); do
  declare -A tps=()
  for name in "${order[@]}"; do
    tps[$name]=$(run "$name")
    printf "  round %d  %-12s %8.0f tok/s\n" "$round" "$name" "${tps[$name]}"
  done
  for name in pp2_dp2_m4 pp2_dp2_m8; do
    awk -v a="${tps[$name]}" -v b="${tps[dp4]}" -v n="$name" 'BEGIN { print n, a / b }' >> "$tmp/ratios"
  done
  mapfile -t order < <(printf '%s\n' "${order[@]}" | tac)
done
for name in pp2_dp2_m4 pp2_dp2_m8; do
  awk -v n="$name" '$1 == n { print $2 }' "$tmp/ratios" | sort -g |
    awk -v n="$name" '{ r[NR] = $1 } END { printf "RESULT %s_over_dp4 %.3f\n", n, r[int((NR + 1) / 2)] }'
done
