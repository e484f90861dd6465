#!/usr/bin/env bash
# CPU calibration of the planner (docs/PLANNER.md "Calibration"): trains three tiny CPU
# recipes and two 2-process ones (tp2, dp2), fits the CPU's constants (and the
# communication latency and compute slots) with `mtnlg plan --calibrate`, then trains other tiny
# layouts (shapes, micro batch, recompute, tensor / pipeline / data parallel over MPI) and
# prints, per layout, the measured step time, the calibrated planner's prediction and the
# error. Step time = the fastest iteration of REPS runs (the first iteration of each left
# out), the estimator `--calibrate --step-stat min` uses: other processes on a shared
# machine only ever slow an iteration down. STAT=median uses medians instead.
#   usage: scripts/bench/plan_calibrate_bench.sh [BUILD_DIR]
#   env:   REPS (default 3), ITERS (iterations per run, default 8), KEEP=DIR (keep the runs),
#          REUSE=1 (with KEEP: fit and predict again from the runs already in DIR),
#          SOFTWARE (planner software profile, default mtnlg: this trainer's attention and memory)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
bin="$build/mtnlg"
reps="${REPS:-3}"
iters="${ITERS:-8}"
software="${SOFTWARE:-mtnlg}"
stat="${STAT:-min}"
tmp="${KEEP:-$(mktemp -d)}"
mkdir -p "$tmp"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT

# recipe NAME LAYERS HIDDEN MICRO BATCH RECOMPUTE TP PP SP
recipe() {
  cat >"$tmp/$1.yaml" <<YAML
model: {num_layers: $2, hidden_size: $3, num_attention_heads: 4, seq_length: 64, vocab_size: 512,
        make_vocab_size_divisible_by: 8, hidden_dropout: 0.0, attention_dropout: 0.0}
parallel: {recompute_granularity: $6, tensor_model_parallel_size: $7, pipeline_model_parallel_size: $8,
           sequence_parallel: $9}
training: {precision: fp32, micro_batch_size: $4, global_batch_size: $5, train_iters: $iters, num_threads: 1}
data: {mock: true}
optimizer: {lr: 1.0e-3, min_lr: 1.0e-4, lr_warmup_tokens: 1024}
logging: {tensorboard: false, log_interval: 1}
YAML
}

step_of() {
  /usr/bin/python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if 'step_time_s' in l]
t = [r['step_time_s'] for r in rows[1:]]
print(min(t) if sys.argv[2] == 'min' else statistics.median(t))" "$1/metrics.jsonl" "$stat"
}

# train NAME NP: REPS runs, prints the directory of the fastest one
train() {
  local name="$1" np="$2" best="" best_t=""
  for r in $(seq "$reps"); do
    local dir="$tmp/$name.run$r"
    if [ -n "${REUSE:-}" ]; then
      [ -f "$dir/metrics.jsonl" ] || continue
    else
      rm -rf "$dir"
    fi
    if [ -n "${REUSE:-}" ]; then
      :
    elif [ "$np" = 1 ]; then
      "$bin" train "$tmp/$name.yaml" --quiet --set logging.dir="$dir" >/dev/null
    else
      sh "$repo/test/support/mpi/mpirun.sh" "$np" "$bin" train "$tmp/$name.yaml" --quiet --set logging.dir="$dir" >/dev/null
    fi
    local t
    t=$(step_of "$dir")
    if [ -z "$best" ] || /usr/bin/python3 -c "import sys; sys.exit(0 if $t < $best_t else 1)"; then
      best="$dir" best_t="$t"
    fi
  done
  echo "$best"
}

# Calibration set: three single-process layouts that load the three hardware constants
# differently (large GEMMs, small GEMMs, full recompute), and (MPI=1) two 2-process
# layouts: tensor parallel (many collectives: the communication latency) and data
# parallel (mostly compute: how much slower two processes compute side by side).
recipe cal1 2 256 2 8 none 1 1 false
recipe cal2 4 384 1 4 none 1 1 false
recipe cal3 2 512 2 4 full 1 1 false
recipe cal4 2 256 2 8 none 2 1 false
recipe cal5 2 256 2 8 none 1 1 false
# Held-out layouts: np, description
declare -A np_of desc_of
add() { np_of[$1]=$2; desc_of[$1]="$3"; }
recipe t_sel 3 320 2 8 selective 1 1 false; add t_sel 1 "3x320 b2 B8 selective"
recipe t_wide 2 448 4 8 none 1 1 false; add t_wide 1 "2x448 b4 B8"
recipe t_deep 6 256 1 4 full 1 1 false; add t_deep 1 "6x256 b1 B4 full"
recipe t_mid 4 320 2 4 none 1 1 false; add t_mid 1 "4x320 b2 B4"
recipe t_tp2 4 192 2 8 full 2 1 false; add t_tp2 2 "4x192 b2 B8 tp2 full"
recipe t_tp2sp 2 256 2 8 selective 2 1 true; add t_tp2sp 2 "2x256 b2 B8 tp2 sp selective"
recipe t_pp2 4 192 1 8 none 1 2 false; add t_pp2 2 "4x192 b1 B8 pp2"
recipe t_dp2 4 192 1 8 selective 1 1 false; add t_dp2 2 "4x192 b1 B8 dp2 selective"
held=(t_sel t_wide t_deep t_mid)
held_mpi=(t_tp2 t_tp2sp t_pp2 t_dp2)  # MPI=0 skips them

cal_args=()
for c in cal1 cal2 cal3; do cal_args+=(--calibrate "$(train "$c" 1)"); done
[ "${MPI:-1}" = 0 ] || cal_args+=(--calibrate "$(train cal4 2)" --calibrate "$(train cal5 2)")
"$bin" plan "${cal_args[@]}" --gpu cpu --software "$software" --step-stat "$stat" \
  --profile-out "$tmp/cpu-profile.json" | sed 's/^/  /'

# row NAME: trains it (or reuses), prints its table row, appends its error to errs
errs=()
row() {
  local name="$1" np=${np_of[$1]} dir meas pred err
  dir=$(train "$name" "$np")
  meas=$(step_of "$dir")
  pred=$("$bin" plan "$tmp/$name.yaml" --gpus "$np" --gpu-profile "$tmp/cpu-profile.json" --software "$software" --json |
    /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['iteration_time_s'])")
  err=$(/usr/bin/python3 -c "print(f'{100 * ($pred / $meas - 1):+.1f}')")
  errs+=("$err")
  printf '| %s | %s | %.4f | %.4f | %s%% |\n' "${desc_of[$name]}" "$np" "$meas" "$pred" "$err"
}
summary() {
  /usr/bin/python3 -c "
import statistics, sys
e = [abs(float(x)) for x in sys.argv[2:]]
print(f'\n{len(e)} {sys.argv[1]}: median |error| {statistics.median(e):.1f}%, worst {max(e):.1f}%')" "$@"
}
printf '\n| held-out layout | processes | measured (s) | predicted (s) | error |\n|---|---|---|---|---|\n'
for name in "${held[@]}"; do row "$name"; done
summary "single-process held-out layouts" "${errs[@]}"
if [ "${MPI:-1}" != 0 ]; then
  # Several MPI processes on a loaded machine: every collective waits for the peer process
  # to be scheduled, which the fitted communication latency stands for (docs/PLANNER.md).
  errs=()
  printf '\n| multi-process layout | processes | measured (s) | predicted (s) | error |\n|---|---|---|---|---|\n'
  for name in "${held_mpi[@]}"; do row "$name"; done
  summary "multi-process layouts (MPI over shared memory)" "${errs[@]}"
fi
echo "software profile: $software; machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); runs kept in ${KEEP:-(deleted)}"
