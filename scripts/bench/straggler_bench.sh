#!/usr/bin/env bash
# Straggler detection overhead (app/train/trainer.cpp, StragglerDetector): the same 4-rank
# CPU training run with detection on (the defaults: margin 1.2, 3 intervals; a timer
# around every blocking MPI wait, and at each log iteration one all-reduce of a
# [world] vector) and off (logging.straggler_margin=0), alternating ROUNDS times so drift
# of the machine hits both alike. log_interval 1 is the worst case (a reduction every step).
#   usage: scripts/bench/straggler_bench.sh [BUILD_DIR] [ITERS]
#   env:   ROUNDS (default 5), RECIPE (default recipes/tiny-mock.yaml), EXTRA (more --set)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/bench/ab_train.sh
. "$repo/scripts/bench/ab_train.sh"
ab_init "${1:-}" "${2:-30}"

read -r -a sets <<<"${EXTRA:-}"
on_all=() off_all=()
for r in $(seq "$rounds"); do
  on_all+=("$(ab_tokens_per_s 4 "$tmp/on-$r" --set logging.straggler_margin=1.2 "${sets[@]}")")
  off_all+=("$(ab_tokens_per_s 4 "$tmp/off-$r" --set logging.straggler_margin=0 "${sets[@]}")")
done
ab_header
ab_row dp4 "${on_all[*]}" "${off_all[*]}"
