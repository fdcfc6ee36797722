#!/usr/bin/env bash
# FP8 training against float32 and bfloat16: the demo model (configs/demo.toml's [model]
# and [train]) for 300 steps, same data and seed, on 2 ranks as dp = 2 with fully_shard
# (data_parallel = "fsdp"), under `hp train` with a metrics file of every step:
#   fp32            float32
#   bf16            [train] mixed_precision_param = "bfloat16" (reduction float32)
#   fp8_<scaling>   bf16 plus FP8 block Linears ([low_precision]): tensorwise, rowwise,
#                   mx_block and delayed (tensorwise from a 16-step amax history)
#   fp8_tensorwise_ag  float32 parameters, FP8 tensorwise, FP8 all-gather in fully_shard
# Per config: the final loss (mean of the last 10 steps), the loss curve's distance from
# fp32's (mean |loss - loss_fp32| over all steps, and the largest |loss - loss_fp32| /
# loss_fp32), and the median step time of the second half over fp32's. Losses do not
# depend on the machine's load; step times do (and the CPU runs FP8 as quantize ->
# dequantize -> float32 product, slower than float32 by design).
#   bench/fp8.sh [steps]                      (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
bin=${HP_BUILD:-build}/bin
[ -x "$bin/hp" ] && [ -x "$bin/hprun" ] || { echo "fp8.sh: build first (no $bin/hp)" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# fp8_tensorwise_ag: FP8 tensorwise with fully_shard's FP8 all-gather, on float32
# parameters (the gather casts float32 weights; with bf16 ones it is refused). Its bytes
# against bf16's gather are counted by bench_fsdp (RESULT fp8_all_gather_bytes_ratio).
config() {  # name, extra TOML lines
  sed -e "s/^shape = .*/shape = [2]/" -e "s/^names = .*/names = [\"dp\"]/" \
      -e "s/^data_parallel = .*/data_parallel = \"fsdp\"/" -e "s/^steps = .*/steps = $steps/" \
      -e "s/^log_every = .*/log_every = 1\nmetrics_file = \"${tmp//\//\\/}\/$1.jsonl\"/" configs/demo.toml > "$tmp/$1.toml"
  printf '%b' "$2" | awk -v f="$tmp/$1.toml" '
    /^\[/ { section = $0; next }
    { extra[section] = extra[section] $0 "\n" }
    END {  # each extra line into its section of the file, or a new section at the end
      while ((getline line < f) > 0) {
        out = out line "\n"
        if (line ~ /^\[/) { if (line in extra) { out = out extra[line]; delete extra[line] } }
      }
      for (s in extra) out = out "\n" s "\n" extra[s]
      close(f)
      printf "%s", out > f
    }'
}
bf16='[train]\nmixed_precision_param = "bfloat16"\n'
fp8() {  # scaling, delayed
  echo "$bf16[low_precision]\nscaling = \"$1\"\ndelayed = $2\n"
}
names=(fp32 bf16 fp8_tensorwise fp8_rowwise fp8_mx_block fp8_delayed_tensorwise fp8_tensorwise_ag)
config fp32 ""
config bf16 "$bf16"
config fp8_tensorwise "$(fp8 tensorwise false)"
config fp8_rowwise "$(fp8 rowwise false)"
config fp8_mx_block "$(fp8 mx_block false)"
config fp8_delayed_tensorwise "$(fp8 tensorwise true)"
config fp8_tensorwise_ag '[low_precision]\nscaling = "tensorwise"\nfsdp_float8_all_gather = true\n'

echo "# bench/fp8.sh: demo model, $steps steps, dp = 2 fsdp, $(getconf _NPROCESSORS_ONLN) cores," \
     "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tools bench || echo +changes), $(date -u '+%F %T') UTC"
for name in "${names[@]}"; do
  start=$SECONDS
  "$bin/hprun" --nproc-per-node 2 "$bin/hp" train --config "$tmp/$name.toml" > "$tmp/$name.log" 2>&1 ||
    { tail -20 "$tmp/$name.log" >&2; exit 1; }
  # step loss ms_per_step, one line per step
  sed -E 's/.*"step":([0-9]+).*"loss":([-0-9.eE+]+).*"ms_per_step":([-0-9.eE+]+).*/\1 \2 \3/' "$tmp/$name.jsonl" \
    > "$tmp/$name.txt"
  [ "$(wc -l < "$tmp/$name.txt")" -eq "$steps" ] || { echo "fp8.sh: $name logged the wrong number of steps" >&2; exit 1; }
  echo "  ran $name in $((SECONDS - start)) s"
done

final() { tail -10 "$tmp/$1.txt" | awk '{ s += $2 } END { printf "%.6f", s / NR }'; }
median_ms() {
  awk -v half=$((steps / 2)) '$1 >= half { print $3 }' "$tmp/$1.txt" | sort -g |
    awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] }'
}
fp32_ms=$(median_ms fp32)
bf16_final=$(final bf16)
printf "%-24s %12s %14s %14s %10s %12s\n" config final_loss mean_abs_vs_fp32 max_rel_vs_fp32 "ms/step" "time/fp32"
for name in "${names[@]}"; do
  read -r mean_abs max_rel < <(paste "$tmp/$name.txt" "$tmp/fp32.txt" |
    awk '{ d = $2 - $5; if (d < 0) d = -d; s += d; r = d / $5; if (r > m) m = r } END { printf "%.6f %.6f\n", s / NR, m }')
  ms=$(median_ms "$name")
  printf "%-24s %12s %14s %14s %10s %12.3f\n" "$name" "$(final "$name")" "$mean_abs" "$max_rel" "$ms" \
    "$(awk -v a="$ms" -v b="$fp32_ms" 'BEGIN { print a / b }')"
  echo "$name $(final "$name") $mean_abs $max_rel $ms" >> "$tmp/summary"
done
while read -r name loss mean_abs max_rel ms; do
  [ "$name" = fp32 ] && continue
  [ "$name" = bf16 ] || awk -v n="$name" -v a="$loss" -v b="$bf16_final" 'BEGIN { printf "RESULT %s_final_loss_vs_bf16 %.4f\n", n, a / b }'
  echo "RESULT ${name}_loss_mean_abs_vs_fp32 $mean_abs"
  echo "RESULT ${name}_loss_max_rel_vs_fp32 $max_rel"
  awk -v n="$name" -v a="$ms" -v b="$fp32_ms" 'BEGIN { printf "RESULT %s_step_time_vs_fp32_under_load %.3f\n", n, a / b }'
done < "$tmp/summary"
awk -v a="$bf16_final" -v b="$(final fp32)" 'BEGIN { printf "RESULT bf16_final_loss_vs_fp32 %.4f\n", a / b }'
