# Shared by the on/off overhead benchmarks (straggler_bench.sh, step_timing_bench.sh,
# forensics_bench.sh, watchdog_bench.sh, nccl_watchdog_bench.sh): source it after setting
# repo (the checkout), then
#   ab_init BUILD_DIR ITERS           build (default $repo/build), binary ($build/mtnlg),
#                                     iters, rounds ($ROUNDS, default 5), recipe ($RECIPE,
#                                     default tiny-mock) and a temporary directory tmp
#                                     removed on exit
#   ab_tokens_per_s NP DIR [ARGS...]  one `mtnlg train` of NP ranks under test/support/mpi/mpirun.sh
#                                     (1 thread each, log every step, metrics in DIR, its
#                                     output in DIR.log, ARGS appended); prints rank 0's
#                                     median tokens/s after the first 3 steps (warm-up)
#   ab_step_time_s NP DIR [ARGS...]   the same run; prints the median step time (s)
#   ab_median VALUES...               the median of the values
#   ab_row LABEL ON_VALUES OFF_VALUES one table row: medians, their ratio, every round
#   ab_header [UNIT]                  the table's header (UNIT default tok/s)
# Environment for one run goes before the call: `MTNLG_X=0 ab_tokens_per_s 4 "$tmp/off"`.
ab_init() {
  build="${1:-$repo/build}"
  binary="$build/mtnlg"
  iters="$2"
  rounds="${ROUNDS:-5}"
  recipe="${RECIPE:-$repo/recipes/tiny-mock.yaml}"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
}

ab_run_median() {  # ab_run_median KEY NP DIR [ARGS...]
  local key="$1" np="$2" dir="$3"
  shift 3
  sh "$repo/test/support/mpi/mpirun.sh" "$np" "$binary" train "$recipe" --quiet --set training.train_iters="$iters" \
    --set training.num_threads=1 --set logging.log_interval=1 --set logging.dir="$dir" "$@" >"$dir.log" 2>&1
  /usr/bin/python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$dir/metrics.jsonl') if '$key' in l]
print(f\"{statistics.median(r['$key'] for r in rows[3:]):.5g}\")"
}
ab_tokens_per_s() { ab_run_median tokens_per_s "$@"; }
ab_step_time_s() { ab_run_median step_time_s "$@"; }

ab_median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

ab_row() {
  local label="$1" on_list="$2" off_list="$3" on off
  # shellcheck disable=SC2086
  on=$(ab_median $on_list)
  # shellcheck disable=SC2086
  off=$(ab_median $off_list)
  printf '%-12s %12s %12s %8s   %s | %s\n' "$label" "$on" "$off" "$(/usr/bin/python3 -c "print(f'{$on/$off:.3f}')")" \
    "$on_list" "$off_list"
}

ab_header() {
  local unit="${1:-tok/s}"
  printf '%-12s %12s %12s %8s   %s\n' "layout" "on ($unit)" "off ($unit)" "on/off" "rounds on | off"
}
