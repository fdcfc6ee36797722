#!/usr/bin/env bash
# Fault trials from outside the processes, on `hp train` with 4 ranks (dp=2 x tp=2,
# deterministic, 40 steps, an asynchronous checkpoint every 4):
#   kill   a random rank SIGKILLed at a random time, either while it trains or the moment a
#          save is in flight; hprun --max-restarts restarts the group, which resumes;
#   job    the whole job (launcher and ranks) SIGKILLed at a random time, then run again;
#   corrupt  the newest checkpoint damaged (a data byte, a header byte, a metadata value,
#          a truncated or deleted rank file, a deleted metadata.json), then resumed.
# Each interrupted run's final checkpoint must equal an uninterrupted run's byte for byte
# (trials whose victim had already ended are shown, not counted); a damaged
# checkpoint must end in a clear error or a fallback to an older one, never in a resume
# from it. Prints one line per trial, then RESULT lines.
#
#   bench/faults.sh [kill trials] [job trials]      (defaults 10 and 10)
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-10}
jobs=${2:-10}
bin=build/bin
[ -x $bin/hp ] && [ -x $bin/hprun ] || { echo "faults: build first (make build)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp/" 2>/dev/null || true; [ -n "${HP_FAULTS_KEEP:-}" ] || rm -rf "$tmp"' EXIT

config() {  # dir steps
  mkdir -p "$1"
  cat > "$1/run.toml" <<TOML
[mesh]
shape = [2, 2]
names = ["dp", "tp"]
[model]
dim = 32
layers = 2
heads = 2
kv_heads = 2
ffn_dim = 64
max_seq = 16
[train]
steps = $2
batch = 4
seq = 16
lr = 1e-2
warmup = 2
log_every = 1
deterministic = true
[checkpoint]
dir = "$1/ckpt"
every = 4
keep = 3
async = true
TOML
  echo "$1/run.toml"
}

train() {  # config [hprun flags...]: output in $config.log, exit code returned
  local cfg=$1
  shift
  $bin/hprun --nproc-per-node 4 "$@" $bin/hp train --config "$cfg" > "$cfg.log" 2>&1
}

same_as_clean() {  # dir: its final checkpoint equals the clean run's, byte for byte
  local a="$tmp/clean/ckpt/step-$(printf %08d "$steps")" b="$1/ckpt/step-$(printf %08d "$steps")"
  [ -d "$b" ] && diff -rq "$a" "$b" > /dev/null
}

rank_pid() {  # run dir, rank: the pid of that rank's process, if running
  local pid
  for pid in $(pgrep -f "hp train --config $1/run.toml" || true); do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$pid"; return 0; }
  done
  return 0
}

rand_ms() { echo $((RANDOM % $1)); }  # 0 .. $1-1
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
until_training() {  # log: waits for its first step line (at most 60 s)
  for _ in $(seq 1 6000); do grep -q "step  *1 " "$1" 2> /dev/null && return 0; sleep 0.01; done
}

steps=40
clean_cfg=$(config "$tmp/clean" $steps)
train "$clean_cfg" &
job=$!
until_training "$clean_cfg.log"
start=$(now_ms)
wait $job || { cat "$clean_cfg.log"; exit 1; }
train_ms=$(($(now_ms) - start))  # from the first step line to the end
echo "uninterrupted run: ${train_ms} ms of training after start-up"

# judge INTERRUPTED EXIT DIR: sets verdict; counts the trial (in counted, ok) only when
# the kill interrupted something.
counted=0 ok=0
judge() {
  if [ "$1" != yes ]; then
    verdict="not counted: it had ended before the kill"
    return
  fi
  counted=$((counted + 1))
  if [ "$2" = 0 ] && same_as_clean "$3"; then verdict=bitwise ok=$((ok + 1)); else verdict="DIFFERS (exit $2)"; fi
}

for ((t = 0; t < kills; ++t)); do
  dir="$tmp/kill$t" rank=$((RANDOM % 4)) during=$([ $((t % 2)) = 0 ] && echo training || echo saving)
  cfg=$(config "$dir" $steps)
  train "$cfg" --max-restarts 2 &
  job=$!
  if [ "$during" = training ]; then
    until_training "$cfg.log"
    sleep_ms "$(rand_ms $((train_ms / 2)))"
  else  # the moment a save after the first is in flight
    for _ in $(seq 1 2000); do
      compgen -G "$dir/ckpt/.tmp-step-*" > /dev/null && [ -n "$(compgen -G "$dir/ckpt/step-*")" ] && break
      sleep 0.005
    done
  fi
  pid=$(rank_pid "$dir" $rank)
  [ -n "$pid" ] && kill -KILL "$pid" 2> /dev/null || true
  code=0
  wait $job || code=$?
  resumed=$(grep -o "resumed at step [0-9]*" "$cfg.log" | tail -1 || true)
  judge "$(grep -q "signal 9" "$cfg.log" && echo yes)" $code "$dir"
  echo "kill $t: rank $rank during $during${pid:+ (pid $pid)}${resumed:+, $resumed}: $verdict"
  rm -rf "$dir"
done
kill_n=$counted kill_ok=$ok counted=0 ok=0

for ((t = 0; t < jobs; ++t)); do
  dir="$tmp/job$t"
  cfg=$(config "$dir" $steps)
  at=$(rand_ms $((train_ms / 2)))
  setsid bash -c "$bin/hprun --nproc-per-node 4 $bin/hp train --config $cfg > $cfg.first.log 2>&1" &
  job=$!
  until_training "$cfg.first.log"
  sleep_ms "$at"
  pkill -KILL -s $job 2> /dev/null || true
  wait $job 2> /dev/null || true  # "Killed": the point of the trial
  code=0
  train "$cfg" || code=$?
  resumed=$(grep -o "resumed at step [0-9]*" "$cfg.log" | tail -1 || true)
  judge "$(grep -q "done:" "$cfg.first.log" || echo yes)" $code "$dir"
  echo "job $t: killed ${at} ms into training${resumed:+, then $resumed}: $verdict"
  rm -rf "$dir"
done
job_n=$counted job_ok=$ok

# Corruption of the clean run's last checkpoint (of 32, 36, 40), then the same run again
# on the damaged copy: it must fall back to 36, train to 40 and save 40 over the damage.
flip() {  # file offset: one bit of that byte changes
  python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1)[0]
f.seek(int(sys.argv[2])); f.write(bytes([b ^ 0x10]))' "$1" "$2"
}
newest=step-00000040
corrupt_ok=0 corrupt_n=0 silent=0
for kind in data-byte header-byte metadata-step truncate delete-rank-file delete-metadata; do
  dir="$tmp/corrupt-$kind"
  mkdir -p "$dir"
  cp -r "$tmp/clean/ckpt" "$dir/ckpt"
  cfg=$(config "$dir" $steps)
  victim="$dir/ckpt/$newest/rank-00001.safetensors"
  case $kind in
    data-byte) flip "$victim" $(($(stat -c %s "$victim") - 7)) ;;
    header-byte) flip "$victim" 12 ;;
    metadata-step) sed -i -E '0,/"step": [0-9]+/s//"step": 39/' "$dir/ckpt/$newest/metadata.json" ;;
    truncate) truncate -s -100 "$victim" ;;
    delete-rank-file) rm "$victim" ;;
    delete-metadata) rm "$dir/ckpt/$newest/metadata.json" ;;
  esac
  code=0
  train "$cfg" || code=$?
  resumed=$(grep -o "resumed at step [0-9]*" "$cfg.log" | tail -1 | grep -o "[0-9]*$" || true)
  said=$(grep -m1 -o "failed verification ([^;]*" "$cfg.log" | cut -c1-140 || true)
  corrupt_n=$((corrupt_n + 1))
  if [ "$resumed" = 40 ]; then
    verdict="SILENT RESUME from the damaged step 40" silent=$((silent + 1))
  elif [ $code = 0 ] && same_as_clean "$dir"; then
    verdict="fell back to step ${resumed:-0}, final state bitwise${said:+; said: $said}" corrupt_ok=$((corrupt_ok + 1))
  elif [ $code != 0 ]; then
    verdict="error: $(grep -m1 -iE "error|corrupt|truncated" "$cfg.log" | cut -c1-160)" corrupt_ok=$((corrupt_ok + 1))
  else
    verdict="DIFFERS"
  fi
  echo "corrupt $kind: $verdict"
done

# Trials whose victim had already ended are not counted.
echo "RESULT faults_kill_rank_bitwise $kill_ok/$kill_n"
echo "RESULT faults_kill_job_bitwise $job_ok/$job_n"
echo "RESULT faults_corruption_handled $corrupt_ok/$corrupt_n"
echo "RESULT faults_corruption_silent_resumes $silent"
