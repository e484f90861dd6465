#!/usr/bin/env bash
# Builds the CUDA backend for Hopper (sm_90 by default) into build-gpu on this (GPU-less)
# build box and packs what a bare GPU machine needs to run scripts/gpu/proof.sh into one
# compressed file, gpu-bundle.tar.xz, at the repository root:
#   .gpu/bin   mtnlg, test_core, test_parallel, test_model, attn_bench (stripped)
#   .gpu/lib   the shared libraries they need that such a machine lacks (yaml-cpp, fmt,
#              OpenBLAS, gfortran, ...); not the C/C++ runtime, not CUDA's, NCCL's or
#              cuDNN's own libraries, which the GPU machine has (the toolkit, or PyTorch's
#              site-packages/nvidia/*/lib: proof.sh finds them at run time)
#   third_party/gpt2   GPT-2's vocabulary for the proof's eval and generate step
# The scripts themselves come with the repository. On the GPU machine, from the root:
#   bash scripts/gpu/proof.sh        (unpacks gpu-bundle.tar.xz when .gpu/ is absent)
# Environment: MTNLG_CUDA_ARCH (default 90), JOBS (default 2), MTNLG_BUNDLE_LIMIT_MIB
# (default 60: the file must fit the size limit of what is copied to the GPU machine).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
arch=${MTNLG_CUDA_ARCH:-90}
jobs=${JOBS:-2}
limit=${MTNLG_BUNDLE_LIMIT_MIB:-60}

# CMAKE_CUDA_STANDARD_REQUIRED=OFF: CMake 3.25 does not know nvcc's C++20 flag and
# would refuse the target; the -std=c++20 option comes from mtnlg_folder_library.
cmake -S . -B build-gpu -G Ninja -DMTNLG_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_CUDA_STANDARD_REQUIRED=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
start=$(date +%s)
targets=(mtnlg test_core test_parallel test_model attn_bench)
nice ninja -C build-gpu -j"$jobs" "${targets[@]}"
echo "build-bundle: built in $(( $(date +%s) - start )) s (-j$jobs, sm_$arch)"
[ -s third_party/gpt2/vocab.json ] || scripts/fetch-gpt2-vocab.sh >/dev/null

rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for b in build-gpu/mtnlg build-gpu/test/test_core build-gpu/test/test_parallel build-gpu/test/test_model \
         build-gpu/bench/attn_bench; do
  cp "$b" .gpu/bin/
  # Every resolved library but the ones any Linux machine or the CUDA installation has.
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libgcc_s.so* | libstdc++.so*) ;;
      libcuda.so* | libcudart.so* | libcublas*.so* | libnccl.so* | libcudnn*.so* | libnvrtc*.so* | libnvJitLink*.so*) ;;
      *) cp -Ln "$lib" .gpu/lib/ ;;
    esac
  done
done
# Host symbols are not needed there (the kernels keep their line info in the fatbin).
strip --strip-unneeded .gpu/bin/* .gpu/lib/* 2>/dev/null || true
tar -cJf gpu-bundle.tar.xz .gpu third_party/gpt2
size=$(( $(stat -c %s gpu-bundle.tar.xz) / 1048576 ))
echo "build-bundle: gpu-bundle.tar.xz is ${size} MiB ($(du -sm .gpu | cut -f1) MiB unpacked)"
if [ "$size" -ge "$limit" ]; then
  echo "build-bundle: over the ${limit} MiB limit" >&2
  exit 1
fi
echo "build-bundle: on the GPU machine, from the repository root: bash scripts/gpu/proof.sh"
