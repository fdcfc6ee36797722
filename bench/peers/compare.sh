#!/usr/bin/env bash
# Global tokens/s of `hp train` (data parallel, with and without shared-memory collectives)
# against PyTorch 2.x's own DDP, FSDP2 and tensor parallelism (bench/peers/peer.py, torch
# from the project's venv) on the same 3.03M-parameter Llama, 8 x 256 tokens per rank and
# step, at 2 and 4 Gloo ranks. Each round runs every contender once, in an order reversed
# from one round to the next; the table holds the medians over rounds.
#   bench/peers/compare.sh [steps] [rounds]        (defaults 20 and 3)
#   PYTHON=/path/to/python bench/peers/compare.sh   (another interpreter with torch >= 2.5)
#   HP_BUILD=/other/build bench/peers/compare.sh     (hp and hprun from there; default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-20}
rounds=${2:-3}
((steps >= 2)) || { echo "steps must be at least 2 (the second half is timed)" >&2; exit 2; }

bin=${HP_BUILD:-build}/bin
if [ ! -x "$bin/hp" ] || [ ! -x "$bin/hprun" ]; then
  echo "compare.sh: no $bin/hp or $bin/hprun: build first" >&2
  exit 1
fi
if [ -z "${PYTHON:-}" ]; then
  [ -f "$(scripts/venv_path)/.hp-complete" ] || ./scripts/setup
  PYTHON=$(scripts/venv_path)/bin/python
fi

# The same environment on both sides. One thread per rank, said explicitly (hprun would
# otherwise pick cores / ranks for hp alone). No malloc tuning: hprun sets
# GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for hp unless it is already set, so it is set here,
# empty unless the caller gave one (then both sides run with that).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLIBC_TUNABLES=${GLIBC_TUNABLES:-}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A config per rank count: configs/bench_3m.toml with 8 sequences per rank. peer.py reads
# the model, seq, lr and global batch from the same file.
seq=$(sed -n 's/^seq = \([0-9]*\).*/\1/p' configs/bench_3m.toml)
for ranks in 2 4; do
  sed -e "s/^shape = .*/shape = [$ranks]/" -e "s/^batch = .*/batch = $((8 * ranks))/" \
      -e "s/^steps = .*/steps = $steps/" -e "s/^log_every = .*/log_every = 1/" \
      configs/bench_3m.toml > "$tmp/hp$ranks.toml"
done

# The two models must be the same: torch's parameter count against hp's module layout
# (a formula over the config, llama.py) and hp's planner (hp dryrun on the same shapes).
read -r torch_params formula_params < <("$PYTHON" bench/peers/llama.py "$tmp/hp2.toml" | awk '{ print $3 }' | xargs)
hp_params=$("$bin/hp" dryrun --json --model configs/bench_3m_desc.toml --strategy dp=1 --devices 1 \
              --topology cluster-16k | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["active_params"])')
hp_at=$bin/hp
[ -n "${HP_BUILD:-}" ] || hp_at+=" at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tools || echo +changes)"
echo "# bench/peers/compare.sh: $steps steps, $rounds round(s), $(getconf _NPROCESSORS_ONLN) cores, $(date -u '+%F %T') UTC"
echo "# hp: $hp_at; torch $("$PYTHON" -c 'import torch; print(torch.__version__)'): $PYTHON"
echo "# parameters: torch $torch_params; hp $formula_params (its modules' shapes), $hp_params (hp dryrun)"
if [ "$torch_params" != "$formula_params" ] || [ "$torch_params" != "$hp_params" ]; then
  echo "compare.sh: the torch model is not hp's (parameter counts differ)" >&2
  exit 1
fi
malloc_env=$(env | grep '^MALLOC_' | xargs || true)
echo "# both sides: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLIBC_TUNABLES=$GLIBC_TUNABLES, MALLOC_*: ${malloc_env:-none}"

# Each prints one number: global tokens/s from the median step time of the second half.
run_hp() {  # ranks shm(0|1)
  local log=$tmp/hp.log
  HP_SHM_COLLECTIVES=$2 "$bin/hprun" --nproc-per-node "$1" "$bin/hp" train \
    --config "$tmp/hp$1.toml" > "$log" 2>&1 || { tail -20 "$log" >&2; return 1; }
  # A progress line per step: the number before "ms/step" of the
  # steps of the second half, the upper median.
  grep -E "^\[rank0\]: step" "$log" | awk -v half=$((steps / 2)) '$3 >= half { print $(NF - 3) }' | sort -g |
    awk -v tokens=$((8 * $1 * seq)) '{ ms[NR] = $1 } END { print tokens / (ms[int(NR / 2) + 1] / 1000) }'
}
run_peer() {  # ranks mode
  local log=$tmp/peer.log
  "$PYTHON" bench/peers/peer.py --mode "$2" --ranks "$1" --steps "$steps" --config "$tmp/hp$1.toml" \
    > "$log" 2>&1 || { tail -20 "$log" >&2; return 1; }
  awk '$1 == "RESULT" { print $3 }' "$log"
}
run() {  # ranks name
  case $2 in
    hp_shm) run_hp "$1" 1 ;;
    hp_noshm) run_hp "$1" 0 ;;
    *) run_peer "$1" "$2" ;;
  esac
}

order=(hp_shm ddp hp_noshm fsdp2 tp)
for ranks in 2 4; do
  for ((round = 1; round <= rounds; round++)); do
    for name in "${order[@]}"; do
      value=$(run "$ranks" "$name")
      printf "  %d ranks  round %d  %-8s %8.0f tok/s\n" "$ranks" "$round" "$name" "$value"
      echo "$ranks $name $value" >> "$tmp/runs"
    done
    mapfile -t order < <(printf '%s\n' "${order[@]}" | tac)  # reversed: drift falls on all alike
  done
done
echo
"$PYTHON" bench/peers/summary.py "$tmp/runs" "$tmp/results"
while read -r name value; do echo "RESULT $name $value"; done < "$tmp/results"
