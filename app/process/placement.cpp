#include "app/process/placement.hpp"

#include <cstdlib>

#include "core/error.hpp"
#include "parallel/communicator.hpp"
#include "planner/cost_model.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/cudnn_attention.hpp"
#include "core/cuda/device.hpp"
#include "core/cuda/ops_cuda.hpp"
#endif

namespace mtnlg::app {

DeviceKind parse_device_kind(const std::string& text, const std::string& what) {
  for (DeviceKind k : {DeviceKind::automatic, DeviceKind::cpu, DeviceKind::cuda, DeviceKind::test})
    if (to_string(k) == text) return k;
  throw_input("{}: \"{}\" is not a device: expected auto|cpu|cuda|test", what, text);
}

Device select_device(DeviceKind kind, const std::string& what) {
  switch (kind) {
    case DeviceKind::cpu: return Device::cpu;
    case DeviceKind::test: return Device::test;
    case DeviceKind::automatic:
    case DeviceKind::cuda: break;
  }
#ifdef MTNLG_HAVE_CUDA
  const int gpus = cuda::device_count();
  if (gpus == 0) {
    if (kind == DeviceKind::automatic) return Device::cpu;
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    throw_input(
        "{}: cuda, but no GPU is visible to this process (CUDA_VISIBLE_DEVICES={}); use cpu, or run on a GPU node",
        what, vis ? vis : "<unset>");
  }
  const auto launch = parallel::detect_launch();
  const int64_t local = parallel::local_process_count();
  if (local > gpus)
    throw_input(
        "{}: {} processes on this node but {} GPU(s): start one process per GPU (srun --ntasks-per-node={}, "
        "mpirun -npernode {})",
        what, local, gpus, gpus, gpus);
  cuda::init_backend(static_cast<int>(launch.local_rank % gpus));
  return Device::cuda;
#else
  if (kind == DeviceKind::automatic) return Device::cpu;
  throw_input(
      "{}: cuda, but this mtnlg was built without the CUDA backend (configure with nvcc on the PATH, "
      "or -DMTNLG_CUDA=ON); use cpu",
      what);
#endif
}

void configure_determinism(Device d, bool deterministic) {
#ifdef MTNLG_HAVE_CUDA
  if (d == Device::cuda) cuda::set_deterministic_attention(deterministic);
#else
  (void)d, (void)deterministic;
#endif
}

std::string describe_device(Device d) {
  switch (d) {
    case Device::cpu: return "cpu";
    case Device::test: return "test device (host memory treated as a device)";
    case Device::cuda: break;
  }
#ifdef MTNLG_HAVE_CUDA
  return "cuda:" + std::to_string(cuda::backend_device()) + " " + cuda::device_name();
#else
  return "cuda";
#endif
}

DeviceMemory device_memory(Device d) {
  DeviceMemory m;
#ifdef MTNLG_HAVE_CUDA
  if (d == Device::cuda) {
    const cuda::MemoryStats s = cuda::memory_stats();
    m.peak_bytes = s.peak_bytes;
    m.reserved_bytes = s.reserved_bytes;
  }
#else
  (void)d;
#endif
  return m;
}

int64_t gemm_fallbacks(Device d) {
#ifdef MTNLG_HAVE_CUDA
  if (d == Device::cuda) return cuda::gemm_fallbacks();
#else
  (void)d;
#endif
  return 0;
}

GpuPeak gpu_peak(const std::string& device_name) {
  const cost::GpuSpec* g = cost::gpu_spec_for_device(device_name);
  if (!g) return {0, fmt::format("{} is not in the planner's GPU table", device_name)};
  return {g->peak_flops / 1e12, fmt::format("{} dense bf16 tensor-core peak, data sheet", g->name)};
}

}  // namespace mtnlg::app
