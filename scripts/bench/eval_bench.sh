#!/usr/bin/env bash
# Eval scoring throughput, mtnlg vs PyTorch, in one run on this machine's CPU.
# mtnlg evaluates the fixture tasks (test/fixtures/eval, all nine) with a random-weight
# model of RECIPE's shape (default GPT-2 124M) and logs each request's window; the
# PyTorch reference (eval_bench_torch.py, Debian python3-torch) then scores requests
# of exactly those shapes with the same batch size and thread count.
# Usage: scripts/bench/eval_bench.sh [BUILD_DIR] [RECIPE] [NUM_FEWSHOT] [BATCH] [THREADS]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
recipe="${2:-$repo/recipes/gpt2-124m.yaml}"
k="${3:-0}"
batch="${4:-8}"
threads="${5:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
out="$("$build/mtnlg" eval --random-init "$recipe" --tasks all --data-dir "$repo/test/fixtures/eval" \
  --num-fewshot "$k" --batch-size "$batch" --bootstrap-iters 1000 --no-progress --log-samples "$tmp/s.jsonl")"
ours="$(echo "$out" | grep -E '^[0-9]+ requests in')"
shape="$(/usr/bin/python3 -c "import yaml,sys; m=yaml.safe_load(open('$recipe'))['model']; print(m['num_layers'], m['hidden_size'], m['num_attention_heads'])" 2>/dev/null || true)"
if [ -z "$shape" ]; then
  shape="$(awk '/num_layers:/{l=$2}/hidden_size:/{h=$2}/num_attention_heads:/{a=$2}END{print l, h, a}' "$recipe")"
fi
theirs="$(/usr/bin/python3 "$repo/scripts/bench/eval_bench_torch.py" "$tmp/s.jsonl" $shape "$batch" "$threads")"
r_ours="$(echo "$ours" | sed -E 's/.*\(([0-9.]+) requests\/s\).*/\1/')"
r_theirs="$(echo "$theirs" | sed -E 's/.*\(([0-9.]+) requests\/s\).*/\1/')"
printf '| %-28s | %-10s | %-8s | %s\n' "model ($(basename "$recipe"))" "few-shot" "batch" "requests/s"
printf '| %-28s | %-10s | %-8s | %s\n' "mtnlg eval (CPU, fp32)" "$k" "$batch" "$r_ours"
printf '| %-28s | %-10s | %-8s | %s\n' "PyTorch $(/usr/bin/python3 -c 'import torch;print(torch.__version__)')" "$k" "$batch" "$r_theirs"
awk -v a="$r_ours" -v b="$r_theirs" 'BEGIN{printf "ratio mtnlg/PyTorch: %.2f\n", a/b}'
