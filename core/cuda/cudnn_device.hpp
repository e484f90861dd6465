// Devices cuDNN can plan for without them: the JSON of a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR
// (cuDNN >= 9.8, "deviceless ahead-of-time compilation" in cuDNN's documentation) for the
// GPUs mtnlg plans for, written from their data sheets, and the CUDA driver stand-in that
// lets cuDNN's runtime-compiled engines finish a plan on a machine without a driver.
// Used by `mtnlg plan` (is the recipe's attention planned for the target GPU, and what
// workspace does it need) and by test/core/cuda/test_cudnn_plan_table.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mtnlg::cuda {

// The properties cuDNN reads (the keys its JSON takes), from the data sheet of one GPU.
struct CudnnDevice {
  std::string key;               // "h100", "h200": as the planner names the GPU
  std::string name;              // deviceName, as cudaGetDeviceProperties reports it
  int64_t device_version = 900;  // deviceVer: compute capability x 100
  int64_t sm_count = 0;
  int64_t global_mem = 0;  // bytes
  int64_t l2_bytes = 0;
  int64_t sm_clock_khz = 0, mem_clock_khz = 0;
  int64_t smem_per_block = 49152, smem_per_block_optin = 0, reserved_smem_per_block = 1024;
  int64_t regs_per_block = 65536, regs_per_sm = 65536;
  int64_t threads_per_block = 1024, threads_per_sm = 2048, ctas_per_sm = 32;
  int64_t driver_version = 13000;  // driverVer: cudaDriverGetVersion's form (CUDA 13.0)
};

// The GPUs with a data-sheet description: H100 SXM5 80 GB and H200 SXM 141 GB (sm90).
const std::vector<CudnnDevice>& cudnn_devices();
// The one named `key` (case-insensitive: "h100", "H200"...), or nullptr.
const CudnnDevice* cudnn_device(const std::string& key);
// Its device-property JSON, as CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION takes it.
std::string cudnn_device_json(const CudnnDevice& d);

// Makes cuDNN's offline planning possible in this process: when no libcuda.so.1 is loaded
// yet, loads the driver stand-in `standin` (libmtnlg_cuda_standin.so, soname libcuda.so.1,
// core/cuda/standin/) so that cuDNN's own dlopen("libcuda.so.1") finds it. Only for
// processes that plan and never run a kernel. Returns "" when a driver (real or stand-in)
// is loaded, else why not.
std::string load_plan_driver(const std::string& standin);

// The stand-in's path next to the running executable (mtnlg's build or install folder).
std::string plan_driver_beside_executable();

}  // namespace mtnlg::cuda
