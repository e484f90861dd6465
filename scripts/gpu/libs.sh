# Sourced by the GPU scripts (proof.sh, train-proof.sh, run-gpu-tests.sh,
# scripts/bench/gpu_bench.sh): the shared libraries a bundle's binaries need on a bare GPU
# machine, found at run time, and compute-sanitizer.
#   gpu_library_path BINDIR   exports LD_LIBRARY_PATH: BINDIR/../lib (the bundle's), the
#                             CUDA toolkit's lib64, and PyTorch's site-packages/nvidia/*/lib
#                             (NCCL, cuDNN, the CUDA libraries its wheels carry)
#   gpu_sanitizer             prints compute-sanitizer's path, or nothing
gpu_library_path() {
  local libs=() d site
  [ -d "$1/../lib" ] && libs+=("$(cd "$1/../lib" && pwd)")
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && libs+=("$d")
  done
  while read -r site; do
    for d in "$site"/nvidia/*/lib; do [ -d "$d" ] && libs+=("$d"); done
  done < <(python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
  LD_LIBRARY_PATH="$(IFS=:; echo "${libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
}

gpu_sanitizer() {
  command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true
}
