#!/usr/bin/env bash
# NCCL watchdog overhead (parallel/flight_recorder.hpp) on the emulated NCCL: the same
# 2-rank CUDA training run of the emulated build (mtnlg-emu, or mtnlg of an EMULATE build)
# with the device watchdog on (CUDA events around every NCCL operation, the recorder's
# rows, the polling thread at 50 ms: the default with a timeout) and off
# (MTNLG_NCCL_WATCHDOG=0; the MPI watchdog of the host collectives stays on in both),
# alternating ROUNDS times so drift of the machine hits both alike. Layouts: tp2 (every
# layer's tensor-parallel all-reduces: the most NCCL operations per step) and dp2 (a few
# large gradient all-reduces).
#   usage: scripts/bench/nccl_watchdog_bench.sh [BINARY] [ITERS]
#   env:   ROUNDS (default 5), RECIPE (default recipes/tiny-mock.yaml)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/bench/ab_train.sh
. "$repo/scripts/bench/ab_train.sh"
ab_init "" "${2:-12}"
binary="${1:-$repo/build/mtnlg-emu}"
export MTNLG_COLLECTIVE_TIMEOUT=600 MTNLG_EMU_DEVICES=2

ab_header s
for layout in "tp2" "dp2"; do
  sets=(--set training.device=cuda)
  [ "$layout" = tp2 ] && sets+=(--set parallel.tensor_model_parallel_size=2)
  on_all=() off_all=()
  for r in $(seq "$rounds"); do
    on_all+=("$(MTNLG_NCCL_WATCHDOG=1 ab_step_time_s 2 "$tmp/on-$layout-$r" "${sets[@]}")")
    off_all+=("$(MTNLG_NCCL_WATCHDOG=0 ab_step_time_s 2 "$tmp/off-$layout-$r" "${sets[@]}")")
  done
  ab_row "$layout" "${on_all[*]}" "${off_all[*]}"
done
