#!/usr/bin/env bash
# The whole GPU proof in one run of a bare GPU machine (CUDA toolkit and driver, PyTorch's
# Python; no MPI, no Debian packages, no network): docs/GPU.md, "The one-run proof".
#
#   on the GPU machine, from the repository root, with gpu-bundle.tar.xz beside it
#   (scripts/gpu/build-bundle.sh; unpacked here into .gpu/ and third_party/gpt2/):
#     bash scripts/gpu/proof.sh [--out DIR] [--budget SECONDS]
#   on a machine without a GPU (CI): every step runs as it would, fails for want of a GPU,
#   and is reported:
#     scripts/gpu/proof.sh --dry-run --bin-dir build --out DIR
#
# Phase A runs these steps at once, each under its own time limit (the GPU has room for
# all of them; the machine's cores feed them):
#   core            test_core "[gpu]~[large]"            every CUDA op against the CPU op
#   core-large      test_core "[large]"                  the real shapes (T 1024/2048, B x H 66000)
#   model           test_model "[gpu]"                   the whole GPT, GPU against CPU
#   parallel        test_parallel "[gpu]"                NCCL and groups of one on the GPU
#   memcheck-core   compute-sanitizer memcheck over test_core "[gpu]~[large]"
#   racecheck-attn  compute-sanitizer racecheck over the attention kernels
#   memcheck-train  compute-sanitizer memcheck over a bf16 `mtnlg train` of tiny-mock
#                   (3 iterations): ERROR SUMMARY: 0 errors
#   train-proof     scripts/gpu/train-proof.sh "tiny resume hf infer mem13b"
# Phase B then runs, alone, on the same machine:
#   nccl-watchdog   bench/nccl_watchdog_op_bench 20000 3: the NCCL watchdog's cost per
#                   operation on the real NCCL (off/on alternating; its table in the summary)
#   ab              gpu_bench.sh --ab: every switch of gpu_bench.py's SWITCHES (attention
#                   unfused/flash, GELU epilogue/kernel, ...) as an A/B pair on the GPT-2
#                   124M row, few steps, order alternated; one "ab NAME B/A RATIO" line each
#                   in the summary (at most 100 s, 40% of what phase A left)
#   bench           scripts/bench/gpu_bench.sh with what is left of the budget.
# Every [gpu] case runs with MTNLG_REQUIRE_GPU=1: no device is a failure, not a skip.
#
# Output in --out (default proof-out): summary.txt (the GPU, then one line per step: PASS or
# FAIL, its exit status, seconds, its last telling line), logs.tar.xz (every step's log and
# the bench's table), and the bench's files. Exit status: the number of failed steps.
# Options: --budget (default 530 s for both phases), --steps "core model ..." (a subset),
# --bin-dir DIR (binaries from a build directory instead of the bundle), --dry-run
# (phase B's bench at its smallest, so a GPU-less run ends in seconds).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
out=proof-out budget=530 dry=0 bindir="" only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --steps) only=" $2 "; shift 2 ;;
    --bin-dir) bindir=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "proof: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
t_start=$SECONDS
mkdir -p "$out"
out=$(cd "$out" && pwd)
logs="$out/logs"
rm -rf "$logs"
mkdir -p "$logs"

# ---- the binaries and the libraries they need, found at run time ------------------------
if [ -z "$bindir" ]; then
  if [ ! -x .gpu/bin/mtnlg ] && [ -f gpu-bundle.tar.xz ]; then
    tar -xJf gpu-bundle.tar.xz 2>/dev/null ||
      python3 -c "import tarfile; tarfile.open('gpu-bundle.tar.xz').extractall()" ||
      echo "proof: gpu-bundle.tar.xz does not unpack" >&2
  fi
  bindir=.gpu/bin
fi
bindir=$(cd "$bindir" 2>/dev/null && pwd) || bindir="$repo/.gpu/bin"
bin() {  # the path of a binary: BINDIR/NAME, BINDIR/test/NAME or BINDIR/bench/NAME
  for p in "$bindir/$1" "$bindir/test/$1" "$bindir/bench/$1"; do [ -x "$p" ] && { echo "$p"; return; }; done
  echo "$bindir/$1"  # missing: the step fails naming it
}
source "$repo/scripts/gpu/libs.sh"
gpu_library_path "$bindir"
export MTNLG_REQUIRE_GPU=1
# cuDNN reports why it refuses a graph on stderr (the fused attention's graphs are new to
# every cuDNN version they meet: a refusal must be readable from the logs).
export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr
san=$(gpu_sanitizer)
san=${san:-compute-sanitizer}

{
  echo "mtnlg GPU proof, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU (nvidia-smi: none)"
  echo "binaries: $bindir; libraries: $LD_LIBRARY_PATH"
  # the OpenBLAS core, and whether cuDNN (the flash attention form) loads, and which
  "$(bin mtnlg)" --version 2>&1 | tail -n +2 || echo "mtnlg --version failed"
} >"$out/summary.txt"

# ---- phase A: correctness, concurrently ---------------------------------------------------
# Each step's limit leaves phase B its share of the budget (the bench gets at least 150 s).
limit_a=$(( (budget - 150) > 60 ? budget - 150 : 60 ))
declare -A pid
steps=()
want() { [ -z "$only" ] || [[ "$only" == *" $1 "* ]]; }
start() {  # start NAME CMD...: in the background, under the phase's limit, into logs/NAME.log
  local name=$1
  shift
  want "$name" || return 0
  steps+=("$name")
  (
    t0=$SECONDS
    timeout --kill-after=10 "$limit_a" "$@" >"$logs/$name.log" 2>&1
    echo "$? $((SECONDS - t0))" >"$logs/$name.rc"
  ) &
  pid[$name]=$!
}
train_tiny=(train recipes/tiny-mock.yaml --set training.device=cuda --set training.precision=bf16
            --set training.train_iters=3 --set logging.dir="$logs/memcheck-train-run" --set logging.log_interval=1)

echo "[$((SECONDS - t_start))s] phase A: correctness (concurrent, ${limit_a} s each)"
start core "$(bin test_core)" "[gpu]~[large]"
start core-large "$(bin test_core)" "[large]"
start model "$(bin test_model)" "[gpu]"
start parallel "$(bin test_parallel)" "[gpu]"
start memcheck-core "$san" --tool memcheck --error-exitcode 9 --leak-check no "$(bin test_core)" "[gpu]~[large]"
start racecheck-attn "$san" --tool racecheck --error-exitcode 9 "$(bin test_core)" "cuda ops table: attention vs CPU"
start memcheck-train "$san" --tool memcheck --error-exitcode 9 --leak-check no "$(bin mtnlg)" "${train_tiny[@]}"
start train-proof env MTNLG_PROOF_BIN="$(bin mtnlg)" MTNLG_PROOF_DIR="$logs/train-proof-run" \
  bash scripts/gpu/train-proof.sh "tiny resume hf infer mem13b"
for name in "${steps[@]}"; do wait "${pid[$name]}" 2>/dev/null; done

# ---- phase B: speed, alone ----------------------------------------------------------------
# The NCCL watchdog's cost per operation on the real NCCL (one-rank group; events, probe and
# flight-recorder row per all-reduce, watchdog off and on alternating; docs/PERFORMANCE.md).
if want nccl-watchdog; then
  steps+=(nccl-watchdog)
  wd_args=(20000 3)
  [ "$dry" = 1 ] && wd_args=(200 1)
  echo "[$((SECONDS - t_start))s] phase B: NCCL watchdog cost per operation (alone)"
  t0=$SECONDS
  timeout --kill-after=10 60 "$(bin nccl_watchdog_op_bench)" "${wd_args[@]}" >"$logs/nccl-watchdog.log" 2>&1
  echo "$? $((SECONDS - t0))" >"$logs/nccl-watchdog.rc"
fi
# The A/B switches first, small (one row, few steps): each is a ratio in the summary.
if want ab; then
  steps+=(ab)
  left=$(( budget - (SECONDS - t_start) - 15 ))
  ab_budget=$(( left * 2 / 5 < 100 ? left * 2 / 5 : 100 ))
  [ "$ab_budget" -lt 20 ] || [ "$dry" = 1 ] && ab_budget=20
  ab_args=(--ab --rows "GPT-2 124M" --warmup 2 --iters 4 --ab-rounds 2 --out "$out/bench-ab" --budget "$ab_budget")
  [ "$dry" = 1 ] && ab_args+=(--warmup 0 --iters 1 --ab-rounds 1)
  echo "[$((SECONDS - t_start))s] phase B: A/B switches (alone, ${ab_budget} s)"
  t0=$SECONDS
  MTNLG_BIN="$(bin mtnlg)" ATTN_BENCH="" timeout --kill-after=10 "$(( ab_budget + 10 ))" \
    bash scripts/bench/gpu_bench.sh "${ab_args[@]}" >"$logs/ab.log" 2>&1
  echo "$? $((SECONDS - t0))" >"$logs/ab.rc"
fi
if want bench; then
  steps+=(bench)
  left=$(( budget - (SECONDS - t_start) - 15 ))
  [ "$left" -lt 30 ] && left=30
  bench_args=(--out "$out/bench" --budget "$left")
  [ "$dry" = 1 ] && bench_args+=(--rows "GPT-2 124M" --iters 1 --warmup 0 --budget 20)
  echo "[$((SECONDS - t_start))s] phase B: speed (alone, ${left} s)"
  t0=$SECONDS
  MTNLG_BIN="$(bin mtnlg)" ATTN_BENCH="$(bin attn_bench)" timeout --kill-after=10 "$(( left + 10 ))" \
    bash scripts/bench/gpu_bench.sh "${bench_args[@]}" >"$logs/bench.log" 2>&1
  echo "$? $((SECONDS - t0))" >"$logs/bench.rc"
fi

# ---- the summary and the archive ------------------------------------------------------------
# A step passes when its command exited 0; the sanitizer steps must also say they found
# nothing, and the tests must have run at least one case.
verdict() {  # verdict NAME -> "PASS|FAIL rc seconds | telling line"
  local name=$1 rc=124 secs=0 log="$logs/$1.log" line ok
  [ -f "$logs/$name.rc" ] && read -r rc secs <"$logs/$name.rc"
  ok=$([ "$rc" = 0 ] && echo 1 || echo 0)
  case "$name" in
    memcheck-*) grep -q "ERROR SUMMARY: 0 errors" "$log" 2>/dev/null || ok=0
                line=$(grep -m1 "ERROR SUMMARY" "$log" 2>/dev/null) ;;
    racecheck-*) grep -q "RACECHECK SUMMARY: 0 hazards" "$log" 2>/dev/null || ok=0
                 line=$(grep -m1 "RACECHECK SUMMARY" "$log" 2>/dev/null) ;;
    train-proof) line=$(grep -E "^(PASS|FAIL) |train-proof:" "$log" 2>/dev/null | tr '\n' ' ') ;;
    bench) line=$(grep -m1 -E "^gpu_bench: " "$log" 2>/dev/null) ;;
    ab) line=$(grep -E "^ab " "$log" 2>/dev/null | cut -d'|' -f1 | tr -s ' ' | sed 's/ $//' | paste -sd';') ;;
    *) grep -qE "All tests passed|test cases: +[0-9]+ \| +[0-9]+ passed" "$log" 2>/dev/null || ok=0
       line=$(grep -E "All tests passed|test cases:" "$log" 2>/dev/null | tail -1) ;;
  esac
  [ -n "$line" ] || line=$(grep -v '^\s*$' "$log" 2>/dev/null | tail -1)
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && line="timed out. ${line}"
  printf '%-15s %s rc %-3s %4ss | %s\n' "$name" "$([ "$ok" = 1 ] && echo PASS || echo FAIL)" "$rc" "$secs" \
    "$(echo "$line" | cut -c1-300)"
}
fails=0
for name in "${steps[@]}"; do
  v=$(verdict "$name")
  echo "$v" >>"$out/summary.txt"
  [[ "$v" == *" PASS rc "* ]] || fails=$((fails + 1))
done
echo "$fails of ${#steps[@]} steps failed, $((SECONDS - t_start)) s" >>"$out/summary.txt"
# The A/B ratios, one line a switch (B's tokens/s over A's, same machine, same run).
grep -E '^ab ' "$logs/ab.log" 2>/dev/null >>"$out/summary.txt"
grep -q '^|' "$logs/nccl-watchdog.log" 2>/dev/null && { echo; grep -E '^(\||#)' "$logs/nccl-watchdog.log"; } >>"$out/summary.txt"
grep -q '^|' "$logs/bench.log" 2>/dev/null && { echo; grep -E '^(\||#|[A-Z])' "$logs/bench.log"; } >>"$out/summary.txt"
tar -cJf "$out/logs.tar.xz" -C "$out" logs 2>/dev/null || tar -czf "$out/logs.tar.gz" -C "$out" logs
rm -rf "$logs"
cat "$out/summary.txt"
exit "$fails"
