#!/usr/bin/env bash
# Train-step benchmark (CPU, fp32): GPT-2 124M shapes (12 layers, hidden 768, 12 heads,
# vocab 50304), micro batch 4, sequence 64, AdamW — mtnlg against PyTorch (Debian's
# python3-torch, same shapes, 2 threads) in the same run. Prints a table with the ratio.
#   usage: scripts/bench/train_step_bench.sh [BUILD_DIR] [STEPS]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
steps="${2:-6}"
threads="${THREADS:-2}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$build/mtnlg" train "$repo/recipes/gpt2-124m.yaml" --quiet \
  --set data.mock=true --set training.precision=fp32 --set training.micro_batch_size=4 \
  --set training.global_batch_size=4 --set model.seq_length=64 --set training.train_tokens=0 \
  --set training.train_iters="$steps" --set model.hidden_dropout=0 --set model.attention_dropout=0 \
  --set training.num_threads="$threads" --set logging.dir="$tmp/run" --set logging.tensorboard=false
ours=$(/usr/bin/python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open('$tmp/run/metrics.jsonl')]
print(f\"{statistics.median(r['step_time_s'] for r in rows[1:]):.4f}\")")
theirs=$(/usr/bin/python3 "$repo/scripts/bench/torch_gpt_step.py" 12 768 12 64 4 50304 "$steps" "$threads" | awk '{print $3}')
printf '%-34s %12s\n' "GPT-2 124M fp32, B=4, T=64" "step (s)"
printf '%-34s %12s\n' "mtnlg ($threads threads)" "$ours"
printf '%-34s %12s\n' "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') ($threads threads)" "$theirs"
/usr/bin/python3 -c "print(f\"{'mtnlg / PyTorch':34s} {$ours/$theirs:12.2f}\")"
