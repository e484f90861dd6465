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
build="${1:-$repo/build}"
iters="${2:-30}"
rounds="${ROUNDS:-5}"
recipe="${RECIPE:-$repo/recipes/tiny-mock.yaml}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Median tokens/s of rank 0's metrics, the first 3 steps (warm-up) excluded.
tokens_per_s() {
  local margin="$1" dir="$2"
  shift 2
  sh "$repo/test/mpi/mpirun.sh" 4 "$build/mtnlg" train "$recipe" --quiet --set training.train_iters="$iters" \
    --set training.num_threads=1 --set logging.log_interval=1 --set logging.straggler_margin="$margin" \
    --set logging.dir="$dir" "$@" >/dev/null 2>&1
  /usr/bin/python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$dir/metrics.jsonl') if 'tokens_per_s' in l]
print(f\"{statistics.median(r['tokens_per_s'] for r in rows[3:]):.1f}\")"
}
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

read -r -a sets <<<"${EXTRA:-}"
on_all=() off_all=()
for r in $(seq "$rounds"); do
  on_all+=("$(tokens_per_s 1.2 "$tmp/on-$r" "${sets[@]}")")
  off_all+=("$(tokens_per_s 0 "$tmp/off-$r" "${sets[@]}")")
done
on=$(med "${on_all[@]}")
off=$(med "${off_all[@]}")
printf '%-12s %12s %12s %8s   %s\n' "dp4" "on (tok/s)" "off (tok/s)" "on/off" "rounds on | off"
printf '%-12s %12s %12s %8s   %s | %s\n' "" "$on" "$off" "$(/usr/bin/python3 -c "print(f'{$on/$off:.3f}')")" \
  "${on_all[*]}" "${off_all[*]}"
