#!/usr/bin/env bash
# Training speed on one GPU, one table: GPT-2 124M, 350M, 1.5B at sequence 1024, a 1.3B at
# 2048, Llama 3 8B's layer at 4 layers and sequence 8192 (grouped-query attention, SwiGLU,
# rope, untied), the same at 2 layers and 32768, and Mixtral 8x7B's layer at 2 layers and 4096
# (8 experts, top-2; mtnlg flash only, without CUDA graphs), bf16, tokens/s and MFU (Megatron's
# 72-form -- Megatron-Core's count, with the routed experts' term, for the Llama and Mixtral
# rows -- and llm.c's 6N form) for mtnlg with
# each attention backend (unfused, flash), PyTorch eager (SDPA, fused AdamW), torch.compile
# and llm.c, with the ratios; then mtnlg's attention op alone against PyTorch's flash SDPA.
# Written for a GPU machine whose commands may run at most 10 minutes: a 540 s budget
# (--budget) skips the runs that no longer fit. torch.compile has its own part of it
# (--compile-budget, default 40%, plus whatever the other runs leave): its rows run last,
# smallest model first, each a fair share; its compilation is timed apart and excluded.
# The details are in scripts/bench/gpu_bench.py.
#
#   on the GPU machine, from the repository root, with the bundle of
#   `MTNLG_BUNDLE=bench scripts/gpu/build-bundle.sh` carried as .gpu/:
#     bash scripts/bench/gpu_bench.sh [--rows "GPT-2 124M,GPT 1.3B"] [--out DIR]
#   the CI smoke test (CPU, tiny shapes, fp32, a few steps; mtnlg's CPU build):
#     scripts/bench/gpu_bench.sh --tiny --cpu --threads 2
#
# Environment: MTNLG_BIN (default .gpu/bin/mtnlg, else build/mtnlg), ATTN_BENCH (default
# beside it: .gpu/bin/attn_bench or build/bench/attn_bench), PYTHON (default python3),
# LLMC_BIN: a prebuilt llm.c train_gpt2cu (never fetched here; without it the llm.c column
# says "not run"), LLMC_FLAGS: extra train_gpt2cu options, PEAK_TFLOPS: the MFU peak for a
# GPU outside the table (H100/H200 SXM 989, A100 SXM 312). Other options pass through to
# gpu_bench.py (--warmup, --iters, --budget, --compile-budget, --per-run, --precision).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
if [ -z "${MTNLG_BIN:-}" ]; then
  if [ -x .gpu/bin/mtnlg ]; then MTNLG_BIN=.gpu/bin/mtnlg; else MTNLG_BIN=build/mtnlg; fi
fi
[ -x "$MTNLG_BIN" ] || { echo "gpu_bench: no mtnlg at $MTNLG_BIN (set MTNLG_BIN)" >&2; exit 2; }
bindir="$(dirname "$MTNLG_BIN")"
if [ -z "${ATTN_BENCH+set}" ]; then
  for c in "$bindir/attn_bench" "$bindir/bench/attn_bench"; do
    if [ -x "$c" ]; then ATTN_BENCH="$c"; break; fi
  done
fi
# The bundle's shared libraries, the toolkit's, and NCCL/cuDNN from PyTorch's site-packages.
source "$repo/scripts/gpu/libs.sh"
gpu_library_path "$bindir"
exec "${PYTHON:-python3}" "$repo/scripts/bench/gpu_bench.py" --mtnlg "$MTNLG_BIN" --attn-bench "${ATTN_BENCH:-}" \
  --python "${PYTHON:-python3}" --llmc "${LLMC_BIN:-}" --llmc-flags "${LLMC_FLAGS:-}" \
  --peak-tflops "${PEAK_TFLOPS:-0}" "$@"
