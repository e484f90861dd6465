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
build="${1:-$repo/build}"
iters="${2:-30}"
rounds="${ROUNDS:-5}"
recipe="${RECIPE:-$repo/recipes/tiny-ramp.yaml}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Median step time (s) of rank 0's metrics, the first 3 steps (warm-up) excluded.
step_time() {
  local timeout="$1" dir="$2"
  shift 2
  MTNLG_COLLECTIVE_TIMEOUT="$timeout" sh "$repo/test/support/mpi/mpirun.sh" 4 "$build/mtnlg" train "$recipe" --quiet \
    --set training.train_iters="$iters" --set training.num_threads=1 --set logging.dir="$dir" "$@" >/dev/null 2>&1
  /usr/bin/python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$dir/metrics.jsonl') if 'step_time_s' in l]
print(f\"{statistics.median(r['step_time_s'] for r in rows[3:]):.5f}\")"
}
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '%-22s %12s %12s %8s   %s\n' "layout (4 ranks)" "on (s)" "off (s)" "on/off" "rounds on | off"
for layout in "dp4" "tp2pp2"; do
  read -r -a sets <<<"${EXTRA:-}"
  [ "$layout" = tp2pp2 ] && sets+=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2)
  on_all=() off_all=()
  for r in $(seq "$rounds"); do
    on_all+=("$(step_time 600 "$tmp/on-$layout-$r" "${sets[@]}")")
    off_all+=("$(step_time 0 "$tmp/off-$layout-$r" "${sets[@]}")")
  done
  on=$(med "${on_all[@]}")
  off=$(med "${off_all[@]}")
  printf '%-22s %12s %12s %8s   %s | %s\n' "$layout" "$on" "$off" "$(/usr/bin/python3 -c "print(f'{$on/$off:.3f}')")" \
    "${on_all[*]}" "${off_all[*]}"
done
