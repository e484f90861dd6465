// Where a command's tensors live: the recipe's training.device (train) or --device
// (eval, generate) resolved against this build and machine, with the CUDA backend
// started on this process's GPU when it is chosen.
#pragma once
#include <cstdint>
#include <string>

#include "config/recipe.hpp"
#include "core/tensor.hpp"

namespace mtnlg::app {

// auto: CUDA when this build has the backend and the machine a GPU, else the CPU.
// cuda: the GPU of this process's local rank (local_rank % GPUs), the backend started on
// it; InputError (exit 2) naming `what` when the build has no CUDA, no GPU is visible, or
// more processes share this node than it has GPUs (NCCL cannot put two ranks of a group
// on one GPU). test: the test device (core/tensor.hpp). cpu: the CPU.
Device select_device(DeviceKind kind, const std::string& what);
// training.deterministic_mode for this process's device, before anything is planned on
// it: on CUDA, cuDNN's deterministic attention backward (core/cuda/cudnn_attention.hpp);
// on the CPU and the test device nothing (their kernels are deterministic either way).
void configure_determinism(Device d, bool deterministic);
// "auto", "cpu", "cuda", "test" (a --device value); InputError naming `what` otherwise.
DeviceKind parse_device_kind(const std::string& text, const std::string& what);
// One line for banners: "cpu", "test device", "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)".
std::string describe_device(Device d);

// The caching allocator's bytes on this process's GPU: the peak in use since the start
// (or the last reset) and what it holds from the driver. Zeros off CUDA.
struct DeviceMemory {
  int64_t peak_bytes = 0, reserved_bytes = 0;
};
DeviceMemory device_memory(Device d);
// Matmuls on this process's GPU since the start that did not run as asked: an optional
// cuBLASLt epilogue refused (its GEMM and separate kernels ran instead), or a GEMM that
// cuBLASLt refused run by cublasGemmEx. 0 off CUDA.
int64_t gemm_fallbacks(Device d);

// The MFU denominator on a GPU: the dense bf16 tensor-core peak (TFLOP/s) of this
// process's GPU from the planner's table, with a description for the banner; 0 and the
// reason when the table does not know the GPU (then logging.peak_tflops sets it).
struct GpuPeak {
  double tflops = 0;
  std::string what;
};
GpuPeak gpu_peak(const std::string& device_name);

}  // namespace mtnlg::app
