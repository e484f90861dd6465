// Tensor: a shape, a dtype, a device and shared storage. Always contiguous (row-major);
// views share storage with an element offset. Ops (core/ops.hpp) dispatch on the
// device and dtype of their arguments, so model code never names a backend.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/mem_account.hpp"

namespace mtnlg {

enum class DType : uint8_t { f32, f64, bf16, f16, i32 };
// cpu: host memory. cuda: the GPU's memory (core/cuda/). test: host memory that the
// process treats as a device (the test device): ops run their CPU kernels on it
// and copies to and from it are device copies, but host code may not read it
// (data<T>() throws), so CI runs the device code path of every command and any host read
// of device memory is an error there, as it would be a crash or a stall on a GPU.
enum class Device : uint8_t { cpu, cuda, test };

int64_t dtype_size(DType t);
std::string to_string(DType t);
std::string to_string(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Raw bytes on one device. CPU storage is 64-byte aligned; CUDA storage comes from the
// caching allocator registered by the CUDA backend.
class Storage {
 public:
  // `pinned`: host storage (dev = cpu) in page-locked memory from the CUDA backend's
  // pinned cache, so device-to-host copies into it run at full DMA speed; ordinary host
  // memory when no CUDA backend is running.
  Storage(int64_t bytes, Device dev, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return dev_; }
  bool pinned() const { return pinned_; }

 private:
  void* ptr_ = nullptr;
  bool pinned_ = false;
  int64_t bytes_ = 0;
  Device dev_;
  mem::Role role_ = mem::Role::workspace;  // counted under it (core/mem_account.hpp)
};

// Which way a copy through the CUDA backend goes.
enum class CopyKind { host_to_device, device_to_host, device_to_device };

// Hooks the CUDA backend installs at start-up (core/cuda/*). Unset = no CUDA.
struct DeviceAllocatorHooks {
  void* (*alloc)(int64_t bytes) = nullptr;
  void (*free)(void* p) = nullptr;
  void (*copy)(void* dst, const void* src, int64_t bytes, CopyKind kind) = nullptr;
  // Page-locked host memory (cached by exact size: checkpoint snapshots repeat sizes).
  void* (*host_alloc)(int64_t bytes) = nullptr;
  void (*host_free)(void* p, int64_t bytes) = nullptr;
  // +1 / -1 as a training step starts / ends (DeviceStepScope).
  void (*step_scope)(int delta) = nullptr;
};
DeviceAllocatorHooks& cuda_allocator_hooks();

// Held by the trainer around each step (forward, backward, reductions, update): while one
// is alive, device memory the caching allocator cannot serve fails at once instead of
// releasing its cache, because that release waits for the whole device and, with
// collectives in flight whose peers wait for this rank, would never return
// (core/cuda/device.hpp). Nestable; a no-op without CUDA.
class DeviceStepScope {
 public:
  DeviceStepScope() : hook_(cuda_allocator_hooks().step_scope) {
    if (hook_) hook_(+1);
  }
  ~DeviceStepScope() {
    if (hook_) hook_(-1);
  }
  DeviceStepScope(const DeviceStepScope&) = delete;
  DeviceStepScope& operator=(const DeviceStepScope&) = delete;

 private:
  void (*hook_)(int) = nullptr;
};

// Host allocations of a training step are the same sizes every step. glibc's defaults
// return every block above 128 KiB to the kernel (mmap/munmap) and trim the heap eagerly,
// so each step faults all its activation pages in again: about 18% of a GPT-2 124M CPU
// step (docs/PERFORMANCE.md). This keeps blocks up to 32 MiB (glibc's maximum) in the
// heap and freed memory in the process for reuse, like a caching allocator. Called once
// at start-up by main(); a no-op without glibc.
void configure_host_allocator();

// Copies between host and device memory (Tensor::to, Tensor::copy_from) since start-up.
// A device -> host copy is a host round trip (the host waits for the device); the
// trainer logs both counts per step at debug level, and its design is one read per step.
int64_t device_to_host_copies();
int64_t host_to_device_copies();

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dt = DType::f32, Device dev = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dt = DType::f32, Device dev = Device::cpu);
  // A host tensor in pinned memory when the CUDA backend runs (Storage), else ordinary
  // host memory: the destination of device-to-host copies that must be fast
  // (checkpoint snapshots).
  static Tensor empty_pinned(const Shape& shape, DType dt = DType::f32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu; }
  // Memory the host may address directly (CPU and test-device tensors); false for CUDA.
  bool host_addressable() const { return device() != Device::cuda; }

  // The first element's address on the tensor's device (a device pointer for CUDA).
  void* raw() const { return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_); }
  // Host access: only for CPU tensors. Host code never reads device memory; reading a
  // CUDA tensor's elements from the host is a RuntimeError naming the tensor (copy it
  // with .to(Device::cpu), or pass raw() to a device API).
  template <typename T>
  T* data() const {
    if (storage_ && storage_->device() != Device::cpu) host_access_error();
    return static_cast<T*>(raw());
  }
  // The element pointer for a kernel that runs where the tensor lives: the CPU kernels
  // (core/ops/) take it for CPU and test-device tensors. Only op
  // implementations call this; a CUDA tensor is an error (its kernels take raw()).
  template <typename T>
  T* kernel_data() const {
    if (storage_ && storage_->device() == Device::cuda) host_access_error();
    return static_cast<T*>(raw());
  }

  // Same storage, new shape (numel must match).
  Tensor view(const Shape& shape) const;
  // Rows [start, start+n) along dim 0, same storage.
  Tensor rows(int64_t start, int64_t n) const;
  // A flat window [start, start+n) of the elements, same storage.
  Tensor flat(int64_t start, int64_t n) const;
  // Deep copy onto `dev`.
  Tensor to(Device dev) const;
  // Copies src's elements into this tensor's memory (same dtype and numel, any devices):
  // uploads, downloads and device-to-device copies into an existing buffer.
  void copy_from(const Tensor& src);
  Tensor clone() const { return to(device()); }
  // This tensor when it already lives on `dev` (no copy), else a copy onto it.
  Tensor on(Device dev) const { return device() == dev ? *this : to(dev); }

 private:
  [[noreturn]] void host_access_error() const;
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // elements
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

}  // namespace mtnlg
