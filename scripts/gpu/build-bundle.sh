#!/usr/bin/env bash
# Builds the CUDA backend for Hopper (sm_90 by default) into build-gpu on this (GPU-less)
# build box and packs mtnlg and the test binaries that hold [gpu] cases, plus the
# shared libraries they need, into .gpu/ with ../shared/scripts/gpu-bundle.sh.
# scripts/gpu/run-gpu-tests.sh is copied along; on the GPU machine run
#   bash .gpu/run-gpu-tests.sh
# (docs/GPU.md). Environment: MTNLG_CUDA_ARCH (default 90), JOBS (default 2),
# MTNLG_BUNDLE=bench: mtnlg and attn_bench only, for scripts/bench/gpu_bench.sh (the
# tests' bundle is close to the 64 MiB a device call carries).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
arch=${MTNLG_CUDA_ARCH:-90}
jobs=${JOBS:-2}
bundle=${MTNLG_GPU_BUNDLE_SCRIPT:-$root/../shared/scripts/gpu-bundle.sh}
[ -f "$bundle" ] || { echo "build-bundle: $bundle not found (set MTNLG_GPU_BUNDLE_SCRIPT)" >&2; exit 2; }

# CMAKE_CUDA_STANDARD_REQUIRED=OFF: CMake 3.25 does not know nvcc's C++20 flag and
# would refuse the target; the -std=c++20 option comes from mtnlg_folder_library.
cmake -S . -B build-gpu -G Ninja -DMTNLG_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_CUDA_STANDARD_REQUIRED=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
start=$(date +%s)
if [ "${MTNLG_BUNDLE:-tests}" = bench ]; then
  targets=(mtnlg attn_bench)
  bins=(build-gpu/mtnlg build-gpu/bench/attn_bench)
else
  targets=(mtnlg test_core test_parallel test_model)
  bins=(build-gpu/mtnlg build-gpu/test/test_core build-gpu/test/test_parallel build-gpu/test/test_model)
fi
nice ninja -C build-gpu -j"$jobs" "${targets[@]}"
echo "build-bundle: built in $(( $(date +%s) - start )) s (-j$jobs, sm_$arch)"

bash "$bundle" build-gpu "${bins[@]}"
# Host symbols are not needed on the GPU machine (device line info stays in the fatbin);
# stripping keeps the bundle under the 64 MiB a device session can carry (openblas
# alone is ~35 MiB).
strip --strip-unneeded .gpu/bin/* 2>/dev/null || true
cp scripts/gpu/run-gpu-tests.sh scripts/gpu/train-proof.sh scripts/gpu/hf-check.py .gpu/
size_mb=$(du -sm .gpu | cut -f1)
echo "build-bundle: .gpu is ${size_mb} MiB"
[ "$size_mb" -lt 64 ] || echo "build-bundle: WARNING: over 64 MiB; a device session cannot carry it whole" >&2
echo "build-bundle: .gpu/ is ready; on the GPU machine, from the repository root:"
echo "  bash .gpu/run-gpu-tests.sh      # every [gpu] case, sync-checked, sanitizers"
echo "  bash .gpu/train-proof.sh        # mtnlg train on the GPU against the CPU, resume, 1.3B memory"
echo "  bash scripts/bench/gpu_bench.sh  # speed table (bundle built with MTNLG_BUNDLE=bench)"
