#!/usr/bin/env bash
# Cost of the spike/NaN forensics checks in steps where nothing goes wrong (the only
# steps a healthy run has): the same 2-rank data-parallel CPU training run with
# training.check_for_nan_in_loss_and_grad=true, training.loss_spike_threshold=3 and
# training.param_hash_interval=1 (the worst case: every step hashes this rank's
# parameters and compares the 64-bit hash across ranks; every step also compares the
# replicas' gradient norms, one all-reduce of two numbers) against the same run with them
# off, alternating ROUNDS times so drift of the machine hits both alike. A replay (when a
# check fires) costs one more forward and backward of that step and is not measured here.
#   usage: scripts/bench/forensics_bench.sh [BUILD_DIR] [ITERS]
#   env:   ROUNDS (default 5), RECIPE (default recipes/tiny-mock.yaml), EXTRA (more --set)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/bench/ab_train.sh
. "$repo/scripts/bench/ab_train.sh"
ab_init "${1:-}" "${2:-40}"

read -r -a sets <<<"${EXTRA:-}"
checks=(--set training.check_for_nan_in_loss_and_grad=true --set training.loss_spike_threshold=3
        --set training.param_hash_interval=1)
on_all=() off_all=()
for r in $(seq "$rounds"); do
  on_all+=("$(ab_tokens_per_s 2 "$tmp/on-$r" "${checks[@]}" "${sets[@]}")")
  off_all+=("$(ab_tokens_per_s 2 "$tmp/off-$r" "${sets[@]}")")
done
ab_header
ab_row dp2 "${on_all[*]}" "${off_all[*]}"
