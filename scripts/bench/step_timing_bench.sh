#!/usr/bin/env bash
# Cost of measuring the step's parts (logging.step_timing; parallel/step_parts.hpp,
# app/train/step_timing.cpp): the same 4-rank CPU training run with the parts on (a clock
# charge at every scope change: forward, backward, recompute, optimizer, data, checkpoint,
# host sync, and every blocking MPI call; at each log iteration one all-reduce of a
# [world x 15] f64 vector) and off (logging.step_timing=false), alternating ROUNDS times so
# drift of the machine hits both alike. log_interval 1 is the worst case (a gather every
# step). Two layouts: dp=4 and tp=2 x pp=2 (many tp collectives and pipeline transfers).
#   usage: scripts/bench/step_timing_bench.sh [BUILD_DIR] [ITERS]
#   env:   ROUNDS (default 5), RECIPE (default recipes/tiny-mock.yaml), EXTRA (more --set)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
iters="${2:-30}"
rounds="${ROUNDS:-5}"
recipe="${RECIPE:-$repo/recipes/tiny-mock.yaml}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Median tokens/s of rank 0's metrics, the first 3 steps (warm-up) excluded.
tokens_per_s() {
  local on="$1" dir="$2"
  shift 2
  sh "$repo/test/mpi/mpirun.sh" 4 "$build/mtnlg" train "$recipe" --quiet --set training.train_iters="$iters" \
    --set training.num_threads=1 --set logging.log_interval=1 --set logging.step_timing="$on" \
    --set logging.dir="$dir" "$@" >/dev/null 2>&1
  /usr/bin/python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$dir/metrics.jsonl') if 'tokens_per_s' in l]
print(f\"{statistics.median(r['tokens_per_s'] for r in rows[3:]):.1f}\")"
}
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

read -r -a sets <<<"${EXTRA:-}"
printf '%-10s %12s %12s %8s   %s\n' "layout" "on (tok/s)" "off (tok/s)" "on/off" "rounds on | off"
for layout in dp4 tp2pp2; do
  lay=()
  [ "$layout" = tp2pp2 ] && lay=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2)
  on_all=() off_all=()
  for r in $(seq "$rounds"); do
    on_all+=("$(tokens_per_s true "$tmp/$layout-on-$r" "${lay[@]}" "${sets[@]}")")
    off_all+=("$(tokens_per_s false "$tmp/$layout-off-$r" "${lay[@]}" "${sets[@]}")")
  done
  on=$(med "${on_all[@]}")
  off=$(med "${off_all[@]}")
  printf '%-10s %12s %12s %8s   %s | %s\n' "$layout" "$on" "$off" "$(/usr/bin/python3 -c "print(f'{$on/$off:.3f}')")" \
    "${on_all[*]}" "${off_all[*]}"
done
