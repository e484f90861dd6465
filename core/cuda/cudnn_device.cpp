#include "core/cuda/cudnn_device.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

namespace mtnlg::cuda {

// Data-sheet values (NVIDIA H100 and H200 Tensor Core GPU data sheets, and the CUDA
// programming guide's table for compute capability 9.0). Both are GH100 parts with 132
// SMs in their SXM form, 50 MiB of L2, 227 KiB of shared memory per block on opt-in
// (228 KiB per SM less 1 KiB reserved), 64 Ki registers per SM and per block, 2048
// threads and 32 blocks per SM; the boost clock is 1980 MHz. The memory sizes are what
// cudaGetDeviceProperties reports for them (81559 MiB and 143771 MiB); the memory clocks
// are HBM3's 2619 MHz and HBM3e's 3201 MHz. When a GPU is lent, the proof replaces these
// with the descriptor the real device serializes (docs/GPU.md).
const std::vector<CudnnDevice>& cudnn_devices() {
  static const std::vector<CudnnDevice> d = [] {
    CudnnDevice h100;
    h100.key = "h100";
    h100.name = "NVIDIA H100 80GB HBM3";
    h100.sm_count = 132;
    h100.global_mem = int64_t{81559} << 20;
    h100.l2_bytes = int64_t{50} << 20;
    h100.sm_clock_khz = 1980000;
    h100.mem_clock_khz = 2619000;
    h100.smem_per_block_optin = 232448;
    CudnnDevice h200 = h100;
    h200.key = "h200";
    h200.name = "NVIDIA H200";
    h200.global_mem = int64_t{143771} << 20;
    h200.mem_clock_khz = 3201000;
    return std::vector<CudnnDevice>{h100, h200};
  }();
  return d;
}

const CudnnDevice* cudnn_device(const std::string& key) {
  std::string k = key;
  std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const CudnnDevice& d : cudnn_devices())
    if (d.key == k) return &d;
  return nullptr;
}

std::string cudnn_device_json(const CudnnDevice& d) {
  nlohmann::json j;
  j["cudaDeviceId"] = 0;
  j["deviceName"] = d.name;
  j["deviceVer"] = d.device_version;
  j["driverVer"] = d.driver_version;
  j["multiProcessorCount"] = d.sm_count;
  j["totalGlobalMem"] = d.global_mem;
  j["l2CacheSize"] = d.l2_bytes;
  j["maxSharedMemoryPerBlock"] = d.smem_per_block;
  j["maxSharedMemoryPerBlockOptin"] = d.smem_per_block_optin;
  j["reservedSharedMemoryPerBlock"] = d.reserved_smem_per_block;
  j["regsPerBlock"] = d.regs_per_block;
  j["maxRegistersPerSM"] = d.regs_per_sm;
  j["maxThreadsPerBlock"] = d.threads_per_block;
  j["maxThreadsPerSM"] = d.threads_per_sm;
  j["maxCtasPerSM"] = d.ctas_per_sm;
  j["warpSize"] = 32;
  j["smClockRateKHz"] = d.sm_clock_khz;
  j["memClockRateKHz"] = d.mem_clock_khz;
  j["maxGridSize"] = {2147483647, 65535, 65535};
  j["maxBlockSize"] = {1024, 1024, 64};
  j["pciDeviceId"] = 0;
  j["isTccDriver"] = 0;  // integers, not booleans: cuDNN 9.19 refuses a JSON true here
  j["supportCoopLaunch"] = 1;
  return j.dump();
}

std::string load_plan_driver(const std::string& standin) {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) return "";  // a driver is loaded already
  if (dlopen(standin.c_str(), RTLD_NOW | RTLD_GLOBAL)) return "";
  const char* e = dlerror();
  return fmt::format("the CUDA driver stand-in {} does not load ({})", standin, e ? e : "?");
}

std::string plan_driver_beside_executable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string dir = ".";
  if (n > 0) {
    const std::string exe(buf, static_cast<size_t>(n));
    dir = exe.substr(0, exe.find_last_of('/'));
  }
  return dir + "/libmtnlg_cuda_standin.so";
}

}  // namespace mtnlg::cuda
