#!/usr/bin/env bash
# Train-step benchmark (CPU): GPT-2 124M shapes (12 layers, hidden 768, 12 heads,
# vocab 50304), micro batch 4, sequence 64, AdamW — mtnlg against PyTorch (Debian's
# python3-torch, same shapes, 2 threads) in the same run. Prints a table with the ratio.
# MODEL=llama: recipes/tiny-llama.yaml instead (4 layers, hidden 128, 4 query heads in 2
# key/value groups, SwiGLU ffn 352, rope, RMSNorm, untied, no biases, vocab 50304, micro
# batch 8, sequence 128, mock tokens) against torch_gpt_step.py --family llama, the same
# shapes written as Hugging Face's Llama.
#   usage: scripts/bench/train_step_bench.sh [BUILD_DIR] [STEPS]
#   env:   MODEL=gpt|llama (default gpt),
#          PRECISION=fp32|bf16|fp16 (mtnlg's; PyTorch runs fp32), THREADS (default 2),
#          BASELINE=OTHER_BUILD_DIR: also time that build's mtnlg, alternating with this
#          one (ROUNDS times, default 3), and print the step-time ratio this / baseline;
#          with it, MEASURE=cpu times each run by the CPU seconds (user + sys) of the whole
#          process instead of its median step's wall time: start-up and the warm-up step
#          included, but far less moved by other jobs on a loaded machine (default: step).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
steps="${2:-6}"
threads="${THREADS:-2}"
precision="${PRECISION:-fp32}"
measure="${MEASURE:-step}"
model="${MODEL:-gpt}"
case "$model" in
  gpt)
    recipe="$repo/recipes/gpt2-124m.yaml"
    shape_sets=(--set training.micro_batch_size=4 --set training.global_batch_size=4 --set model.seq_length=64)
    label="GPT-2 124M $precision, B=4, T=64"
    ;;
  llama)
    recipe="$repo/recipes/tiny-llama.yaml"
    shape_sets=(--set logging.log_interval=1)  # the recipe's own shape: B=8, T=128
    label="tiny-llama $precision, B=8, T=128"
    ;;
  *) echo "train_step_bench.sh: MODEL=$model: expected gpt or llama" >&2; exit 2 ;;
esac
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Median step time (s) of one mtnlg run, the first (warm-up) step excluded; with
# MEASURE=cpu, the CPU seconds of the whole run.
step_time() {
  local bin="$1" dir="$2"
  local run=("$bin" train "$recipe" --quiet
    --set data.mock=true --set training.precision="$precision" "${shape_sets[@]}" --set training.train_tokens=0
    --set training.train_iters="$steps" --set model.hidden_dropout=0 --set model.attention_dropout=0
    --set training.num_threads="$threads" --set logging.dir="$dir" --set logging.tensorboard=false
    --set checkpoint.save="$dir/checkpoints")
  if [ "$measure" = cpu ]; then
    /usr/bin/python3 -c "
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f'{r.ru_utime + r.ru_stime:.3f}')" "${run[@]}"
    return
  fi
  "${run[@]}" >/dev/null
  /usr/bin/python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$dir/metrics.jsonl') if 'step_time_s' in l]
print(f\"{statistics.median(r['step_time_s'] for r in rows[1:]):.4f}\")"
}

if [ -n "${BASELINE:-}" ]; then
  rounds="${ROUNDS:-3}"
  ours_all=() base_all=()
  for r in $(seq "$rounds"); do  # alternate, so drift of the machine hits both alike
    ours_all+=("$(step_time "$build/mtnlg" "$tmp/ours$r")")
    base_all+=("$(step_time "$BASELINE/mtnlg" "$tmp/base$r")")
  done
  med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  ours=$(med "${ours_all[@]}")
  base=$(med "${base_all[@]}")
  unit="step (s)"
  if [ "$measure" = cpu ]; then unit="run CPU (s)"; fi
  printf '%-40s %12s   %s\n' "$label" "$unit" "rounds"
  printf '%-40s %12s   %s\n' "mtnlg $build ($threads threads)" "$ours" "${ours_all[*]}"
  printf '%-40s %12s   %s\n' "mtnlg $BASELINE ($threads threads)" "$base" "${base_all[*]}"
  /usr/bin/python3 -c "print(f\"{'this / baseline':40s} {$ours/$base:12.3f}\")"
  exit 0
fi

if [ "$measure" != step ]; then
  echo "train_step_bench: MEASURE=$measure compares two builds of mtnlg only (set BASELINE)" >&2
  exit 2
fi
ours=$(step_time "$build/mtnlg" "$tmp/run")
if [ "$model" = llama ]; then
  theirs=$(/usr/bin/python3 "$repo/scripts/bench/torch_gpt_step.py" --family llama --layers 4 --hidden 128 --heads 4 \
    --groups 2 --ffn 352 --seq 128 --batch 8 --vocab 50304 --device cpu --threads "$threads" --warmup 1 \
    --iters "$((steps - 1))" 2>/dev/null |
    /usr/bin/python3 -c "import json, sys; print(f\"{json.loads(sys.stdin.read())['step_s']:.4f}\")")
else
  theirs=$(/usr/bin/python3 "$repo/scripts/bench/torch_gpt_step.py" 12 768 12 64 4 50304 "$steps" "$threads" | awk '{print $3}')
fi
printf '%-34s %12s\n' "$label" "step (s)"
printf '%-34s %12s\n' "mtnlg ($threads threads)" "$ours"
printf '%-34s %12s\n' "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') ($threads threads, fp32)" "$theirs"
/usr/bin/python3 -c "print(f\"{'mtnlg / PyTorch':34s} {$ours/$theirs:12.2f}\")"
