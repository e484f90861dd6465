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
bin="${1:-$repo/build/mtnlg-emu}"
iters="${2:-12}"
rounds="${ROUNDS:-5}"
recipe="${RECIPE:-$repo/recipes/tiny-mock.yaml}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Median step time (s) of rank 0's metrics, the first 3 steps (warm-up) excluded.
step_time() {
  local on="$1" dir="$2"
  shift 2
  MTNLG_NCCL_WATCHDOG="$on" MTNLG_COLLECTIVE_TIMEOUT=600 MTNLG_EMU_DEVICES=2 sh "$repo/test/support/mpi/mpirun.sh" 2 \
    "$bin" train "$recipe" --quiet --set training.device=cuda --set training.train_iters="$iters" \
    --set training.num_threads=1 --set logging.log_interval=1 --set logging.dir="$dir" "$@" >"$dir.log" 2>&1
  /usr/bin/python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$dir/metrics.jsonl') if 'step_time_s' in l]
print(f\"{statistics.median(r['step_time_s'] for r in rows[3:]):.5f}\")"
}
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '%-22s %12s %12s %8s   %s\n' "layout (2 ranks)" "on (s)" "off (s)" "on/off" "rounds on | off"
for layout in "tp2" "dp2"; do
  sets=()
  [ "$layout" = tp2 ] && sets+=(--set parallel.tensor_model_parallel_size=2)
  on_all=() off_all=()
  for r in $(seq "$rounds"); do
    on_all+=("$(step_time 1 "$tmp/on-$layout-$r" "${sets[@]}")")
    off_all+=("$(step_time 0 "$tmp/off-$layout-$r" "${sets[@]}")")
  done
  on=$(med "${on_all[@]}")
  off=$(med "${off_all[@]}")
  printf '%-22s %12s %12s %8s   %s | %s\n' "$layout" "$on" "$off" "$(/usr/bin/python3 -c "print(f'{$on/$off:.3f}')")" \
    "${on_all[*]}" "${off_all[*]}"
done
