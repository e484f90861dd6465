#!/usr/bin/env bash
# Runs the [gpu] test cases of a bundle made by scripts/gpu/build-bundle.sh on a GPU
# machine (CUDA toolkit and driver present; no Debian packages, no MPI, no network), every
# [gpu] case also sync-checked: a longer look than scripts/gpu/proof.sh's, for debugging.
#
#   usage: bash scripts/gpu/run-gpu-tests.sh [BUNDLE_DIR]      (default: .gpu, unpacked)
#
# Steps, each with its own pass/fail line in the summary:
#   1. every [gpu] case of each test binary, MTNLG_REQUIRE_GPU=1 (no device = failure);
#   2. the same with MTNLG_CUDA_SYNC_CHECK=1 (a device sync after every launch, so a
#      fault is reported at the kernel that caused it);
#   3. compute-sanitizer --tool memcheck over test_core's [gpu] cases, and
#      --tool racecheck over the shared-memory kernels (attention, reductions),
#      when compute-sanitizer is available.
# MTNLG_GPU_STEPS picks steps (default "tests sync memcheck racecheck"; "memcheck-large"
# adds memcheck over the real-shape [large] cases; where commands are limited to 10
# minutes, run them one per command); MTNLG_GPU_TIMEOUT is
# each step's limit in seconds (default 540).
# Exit status: 0 when every step that ran passed.
set -uo pipefail
bundle=${1:-$(cd "$(dirname "$0")/../.." && pwd)/.gpu}
source "$(dirname "$0")/libs.sh"
gpu_library_path "$bundle/bin"
export MTNLG_REQUIRE_GPU=1
nvidia-smi -L || echo "run-gpu-tests: nvidia-smi failed (no driver?)"

steps=" ${MTNLG_GPU_STEPS:-tests sync memcheck racecheck} "
lim=${MTNLG_GPU_TIMEOUT:-540}
want() { [[ "$steps" == *" $1 "* ]]; }
declare -a names results
fails=0
step() {  # step NAME CMD...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@"
  local rc=$?
  names+=("$name")
  results+=("$([ $rc -eq 0 ] && echo PASS || echo "FAIL(rc=$rc)") $((SECONDS - t0))s")
  [ $rc -eq 0 ] || fails=$((fails + 1))
}

bins=()
for b in test_core test_parallel test_model; do [ -x "$bundle/bin/$b" ] && bins+=("$b"); done
[ ${#bins[@]} -gt 0 ] || { echo "run-gpu-tests: no test binaries in $bundle/bin" >&2; exit 2; }

if want tests; then
  for b in "${bins[@]}"; do step "$b [gpu]" timeout "$lim" "$bundle/bin/$b" "[gpu]"; done
fi
if want sync; then
  for b in "${bins[@]}"; do
    step "$b [gpu] sync-check" env MTNLG_CUDA_SYNC_CHECK=1 timeout "$lim" "$bundle/bin/$b" "[gpu]"
  done
fi

san=$(gpu_sanitizer)
if [ -n "$san" ] && [ -x "$bundle/bin/test_core" ]; then
  want memcheck && step "memcheck test_core [gpu]" timeout "$lim" "$san" --tool memcheck --error-exitcode 9 --leak-check no \
    "$bundle/bin/test_core" "[gpu]~[large]"
  # The real-shape cases ([large]: 824M-element logits, B x H = 66000) take minutes under
  # memcheck: a step of their own, run when asked for.
  want memcheck-large && step "memcheck test_core [large]" timeout "$lim" "$san" --tool memcheck --error-exitcode 9 \
    --leak-check no "$bundle/bin/test_core" "[large]"
  want memcheck && [ -x "$bundle/bin/test_model" ] && step "memcheck test_model [gpu]" timeout "$lim" "$san" \
    --tool memcheck --error-exitcode 9 --leak-check no "$bundle/bin/test_model" "[gpu]"
  want racecheck && step "racecheck attention" timeout "$lim" "$san" --tool racecheck --error-exitcode 9 \
    "$bundle/bin/test_core" "cuda ops table: attention vs CPU"
  want racecheck && step "racecheck reductions" timeout "$lim" "$san" --tool racecheck --error-exitcode 9 \
    "$bundle/bin/test_core" "cuda ops table: cross_entropy vs CPU"
  want racecheck && step "racecheck KV-cache attention" timeout "$lim" "$san" --tool racecheck --error-exitcode 9 \
    "$bundle/bin/test_core" "cuda ops table: attention_cached vs CPU"
else
  echo "run-gpu-tests: compute-sanitizer not found; memcheck/racecheck skipped"
fi

echo
echo "=== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
for i in "${!names[@]}"; do printf '  %-40s %s\n' "${names[$i]}" "${results[$i]}"; done
[ $fails -eq 0 ] && echo "ALL PASSED" || echo "$fails step(s) FAILED"
exit $(( fails > 0 ))
