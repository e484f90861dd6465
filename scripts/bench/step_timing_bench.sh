#!/usr/bin/env bash
# Cost of measuring the step's parts (logging.step_timing; core/step_parts.hpp,
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
# shellcheck source=scripts/bench/ab_train.sh
. "$repo/scripts/bench/ab_train.sh"
ab_init "${1:-}" "${2:-30}"

read -r -a sets <<<"${EXTRA:-}"
ab_header
for layout in dp4 tp2pp2; do
  lay=()
  [ "$layout" = tp2pp2 ] && lay=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2)
  on_all=() off_all=()
  for r in $(seq "$rounds"); do
    on_all+=("$(ab_tokens_per_s 4 "$tmp/$layout-on-$r" --set logging.step_timing=true "${lay[@]}" "${sets[@]}")")
    off_all+=("$(ab_tokens_per_s 4 "$tmp/$layout-off-$r" --set logging.step_timing=false "${lay[@]}" "${sets[@]}")")
  done
  ab_row "$layout" "${on_all[*]}" "${off_all[*]}"
done
