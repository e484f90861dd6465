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
build="${1:-$repo/build}"
iters="${2:-40}"
rounds="${ROUNDS:-5}"
recipe="${RECIPE:-$repo/recipes/tiny-mock.yaml}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Median tokens/s of rank 0's metrics, the first 3 steps (warm-up) excluded.
tokens_per_s() {
  local dir="$1"
  shift
  sh "$repo/test/mpi/mpirun.sh" 2 "$build/mtnlg" train "$recipe" --quiet --set training.train_iters="$iters" \
    --set training.num_threads=1 --set logging.log_interval=1 --set logging.dir="$dir" "$@" >/dev/null 2>&1
  /usr/bin/python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$dir/metrics.jsonl') if 'tokens_per_s' in l]
print(f\"{statistics.median(r['tokens_per_s'] for r in rows[3:]):.1f}\")"
}
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

read -r -a sets <<<"${EXTRA:-}"
checks=(--set training.check_for_nan_in_loss_and_grad=true --set training.loss_spike_threshold=3
        --set training.param_hash_interval=1)
on_all=() off_all=()
for r in $(seq "$rounds"); do
  on_all+=("$(tokens_per_s "$tmp/on-$r" "${checks[@]}" "${sets[@]}")")
  off_all+=("$(tokens_per_s "$tmp/off-$r" "${sets[@]}")")
done
on=$(med "${on_all[@]}")
off=$(med "${off_all[@]}")
printf '%-12s %12s %12s %8s   %s\n' "layout" "on (tok/s)" "off (tok/s)" "on/off" "rounds on | off"
printf '%-12s %12s %12s %8s   %s | %s\n' "dp2" "$on" "$off" "$(/usr/bin/python3 -c "print(f'{$on/$off:.3f}')")" \
  "${on_all[*]}" "${off_all[*]}"
