#!/usr/bin/env bash
# Collective watchdog overhead (parallel/watchdog.hpp): the same 4-rank CPU training run
# with the watchdog on (nonblocking MPI calls polled by MPI_Test, the default in train)
# and off (MTNLG_COLLECTIVE_TIMEOUT=0: blocking MPI calls), alternating ROUNDS times so
# drift of the machine hits both alike. Layouts: dp=4 (gradient all-reduces) and
# tp=2 x pp=2 (many small tp all-reduces and pipeline transfers per step).
#   usage: scripts/bench/watchdog_bench.sh [BUILD_DIR] [ITERS]
#   env:   ROUNDS (default 5), RECIPE (default recipes/tiny-ramp.yaml), EXTRA (more
#          --set arguments, e.g. "--set model.hidden_size=256" for larger gradients)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/bench/ab_train.sh
. "$repo/scripts/bench/ab_train.sh"
RECIPE="${RECIPE:-$repo/recipes/tiny-ramp.yaml}" ab_init "${1:-}" "${2:-30}"

ab_header s
for layout in "dp4" "tp2pp2"; do
  read -r -a sets <<<"${EXTRA:-}"
  [ "$layout" = tp2pp2 ] && sets+=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2)
  on_all=() off_all=()
  for r in $(seq "$rounds"); do
    on_all+=("$(MTNLG_COLLECTIVE_TIMEOUT=600 ab_step_time_s 4 "$tmp/on-$layout-$r" "${sets[@]}")")
    off_all+=("$(MTNLG_COLLECTIVE_TIMEOUT=0 ab_step_time_s 4 "$tmp/off-$layout-$r" "${sets[@]}")")
  done
  ab_row "$layout" "${on_all[*]}" "${off_all[*]}"
done
