#!/usr/bin/env bash
# Which OpenBLAS core the CPU step runs on, and what it costs (docs/RELIABILITY.md,
# class 9): the GPT-2 124M CPU step (shapes of train_step_bench.sh: B=4, T=64, fp32) and
# the sgemm rate mtnlg measures at start-up (best of 6 single 768^3 sgemms, printed in
# the banner as "MFU peak"), under three set-ups in one run, alternating ROUNDS times:
#   default   no OPENBLAS_CORETYPE: what the library detects on this CPU
#   prescott  OPENBLAS_CORETYPE=Prescott: the generic kernel forced (kept, with a warning)
#   auto      MTNLG_TEST_BLAS_CORE=Prescott: mtnlg is told the library chose Prescott
#             and selects the core itself (re-executing with OPENBLAS_CORETYPE set) -
#             what happens with no variable set on a CPU the library does not know
#   usage: scripts/bench/blas_core_bench.sh [BUILD_DIR] [STEPS]     env: ROUNDS (2), THREADS (2)
#   STEPS=0 measures the sgemm rate only (a 1-iteration tiny run; the step column is
#   then that tiny step, not GPT-2 124M's).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
steps="${2:-6}"
rounds="${ROUNDS:-2}"
threads="${THREADS:-2}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Prints "STEP_S SGEMM_TFLOPS CORE" for one run under `env ARGS...`.
run() {
  local dir="$1"
  shift
  if [ "$steps" = 0 ]; then
    env -u OPENBLAS_CORETYPE -u MTNLG_TEST_BLAS_CORE "$@" "$build/mtnlg" train "$repo/recipes/tiny-mock.yaml" \
      --set training.train_iters=2 --set training.num_threads="$threads" --set logging.dir="$dir" \
      --set logging.tensorboard=false >"$dir.log" 2>&1
  else
    env -u OPENBLAS_CORETYPE -u MTNLG_TEST_BLAS_CORE "$@" "$build/mtnlg" train "$repo/recipes/gpt2-124m.yaml" \
      --set data.mock=true --set training.micro_batch_size=4 --set training.global_batch_size=4 \
      --set model.seq_length=64 --set training.train_tokens=0 --set training.train_iters="$steps" \
      --set model.hidden_dropout=0 --set model.attention_dropout=0 --set training.num_threads="$threads" \
      --set logging.dir="$dir" --set logging.tensorboard=false >"$dir.log" 2>&1
  fi
  /usr/bin/python3 - "$dir" <<'PY'
import json, re, statistics, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if "step_time_s" in l]
log = open(d + ".log").read()
m = re.search(r"MFU peak ([0-9.]+) TFLOP/s \(measured CPU sgemm rate, OpenBLAS (\w+)", log)
print(f"{statistics.median(r['step_time_s'] for r in rows[1:]):.3f} {1000 * float(m.group(1)):.1f} {m.group(2)}")
PY
}

declare -A step sg core
for r in $(seq "$rounds"); do
  for setup in default prescott auto; do
    case $setup in
      default) envs=() ;;
      prescott) envs=(OPENBLAS_CORETYPE=Prescott) ;;
      auto) envs=(MTNLG_TEST_BLAS_CORE=Prescott) ;;
    esac
    read -r s g c < <(run "$tmp/$setup-$r" "${envs[@]}")
    step[$setup]+="$s "
    sg[$setup]+="$g "
    core[$setup]=$c
  done
done
# The middle value of the rounds (of an even count, the lower middle one).
med() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
what="GPT-2 124M fp32 B=4 T=64, $steps steps"
[ "$steps" = 0 ] && what="sgemm only (tiny-mock step)"
echo "CPU: $cpu, $threads threads, $what, median of $rounds rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %-10s %14s %10s %14s %10s   %s\n' setup core "sgemm GFLOP/s" "vs auto" "step (s)" "vs auto" "rounds: step | sgemm"
for setup in default prescott auto; do
  s=$(med "${step[$setup]}") g=$(med "${sg[$setup]}")
  sa=$(med "${step[auto]}") ga=$(med "${sg[auto]}")
  printf '%-10s %-10s %14s %10s %14s %10s   %s| %s\n' "$setup" "${core[$setup]}" "$g" \
    "$(/usr/bin/python3 -c "print(f'{$g/$ga:.2f}')")" "$s" "$(/usr/bin/python3 -c "print(f'{$s/$sa:.2f}')")" \
    "${step[$setup]}" "${sg[$setup]}"
done
