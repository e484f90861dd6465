#!/usr/bin/env bash
# README command 2: installs what mtnlg needs (Debian packages, as root; npm tools for the
# tokenizer oracle), builds everything (CUDA kernels too when nvcc exists) and runs every
# test: unit, oracle (PyTorch / numpy / js-tiktoken), e2e (the binary), mpi (mpirun).
# GPU tests run only where a GPU is present; the same [gpu] cases, and the CUDA path end to
# end, run everywhere on the emulated CUDA backend (label emulator, docs/GPU.md).
#   usage: scripts/test.sh [BUILD_DIR]      (default: build)
#   env:   MTNLG_TEST_LABELS="unit|e2e" to run a subset; CTEST_PARALLEL_LEVEL (default 2);
#          MTNLG_CHECK_NOCUDA=0 skips the compile of the build without CUDA (BUILD_DIR-nocuda,
#          scripts/check-nocuda-build.sh: warning-free with -Werror), =all makes it the whole tree
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
cd "$repo"
if [ "$(id -u)" = 0 ]; then
  scripts/install-deps.sh
else
  scripts/install-deps.sh || { echo "test.sh: run as root (sudo scripts/test.sh) to install the packages above" >&2; exit 1; }
fi
scripts/setup-npm-tools.sh >/dev/null
# Source checks (seconds): no function over 80 lines (scripts/check-function-length.py), and,
# once the tree has been formatted in one commit (marked by .clang-format-applied), the
# formatter's layout (scripts/check-format.sh).
scripts/check-function-length.py
if [ -e .clang-format-applied ]; then
  scripts/check-format.sh
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "${MTNLG_BUILD_JOBS:-2}"
if [ "${MTNLG_CHECK_NOCUDA:-1}" != 0 ]; then
  scripts/check-nocuda-build.sh "$build-nocuda"
fi
cd "$build"
labels="${MTNLG_TEST_LABELS:-}"
args=(--output-on-failure --timeout 900 -j "${CTEST_PARALLEL_LEVEL:-2}")
if [ -n "$labels" ]; then args+=(-L "$labels"); fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  args+=(-LE gpu)
  echo "test.sh: no GPU here: tests labelled gpu are skipped (run them on a GPU machine, see README);" \
    "the emulator-labelled tests run the same cases on the emulated CUDA backend"
fi
ctest "${args[@]}"
