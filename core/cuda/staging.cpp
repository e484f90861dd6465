// Pinned host memory and the upload staging ring (staging.hpp), and the copy hook that
// routes Tensor copies between host and device through them. Host code only.
#include "core/cuda/staging.hpp"

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#include "core/error.hpp"
#include "core/refused.hpp"
#include "core/tensor.hpp"

namespace mtnlg::cuda {

namespace {

// Host-to-device uploads of small buffers (token ids, masks) without a host wait: the
// source is copied into a slot of pinned staging memory and the slot is copied to the
// device asynchronously on the backend stream; a slot is reused once its previous copy
// is done (its event). Large uploads (checkpoints) take the synchronous path.
class UploadStaging {
 public:
  static constexpr int64_t kSlotBytes = 4 << 20;
  static constexpr int kSlots = 4;

  void upload(void* dst, const void* src, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!base_) {
      CUDA_CHECK(cudaHostAlloc(&base_, static_cast<size_t>(kSlotBytes) * kSlots, cudaHostAllocDefault));
      for (auto& e : events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    const int slot = next_;
    next_ = (next_ + 1) % kSlots;
    CUDA_CHECK(cudaEventSynchronize(events_[slot]));  // its previous copy (long done, normally)
    char* staged = static_cast<char*>(base_) + static_cast<int64_t>(slot) * kSlotBytes;
    std::memcpy(staged, src, static_cast<size_t>(bytes));
    CUDA_CHECK(cudaMemcpyAsync(dst, staged, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaEventRecord(events_[slot], stream()));
    ++async_uploads_;
  }
  int64_t async_uploads() {
    std::lock_guard<std::mutex> lock(mu_);
    return async_uploads_;
  }

 private:
  std::mutex mu_;
  void* base_ = nullptr;  // pinned, kSlots x kSlotBytes; kept for the process's life
  cudaEvent_t events_[kSlots] = {};
  int next_ = 0;
  int64_t async_uploads_ = 0;
};

// Page-locked host buffers for fast device-to-host copies (checkpoint snapshots), cached
// by exact size: a run saves the same shard sizes every time, and pinning gigabytes
// costs seconds, so a buffer is pinned once and reused by the next save.
class PinnedCache {
 public:
  void* alloc(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw_runtime("cannot pin {} bytes of host memory for a device-to-host copy ({}); {} bytes are pinned already",
                    bytes, cudaGetErrorString(e), pinned_bytes_);
    }
    pinned_bytes_ += bytes;
    return p;
  }
  void free(void* p, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[bytes].push_back(p);
  }
  int64_t pinned_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_bytes_;
  }

 private:
  std::mutex mu_;
  std::unordered_map<int64_t, std::vector<void*>> free_;
  int64_t pinned_bytes_ = 0;
};

PinnedCache& pinned_cache() {
  static auto* c = new PinnedCache;  // leaked on purpose, see device.hpp
  return *c;
}

UploadStaging& staging() {
  static auto* s = new UploadStaging;  // leaked on purpose, see device.hpp
  return *s;
}

void hook_copy(void* dst, const void* src, int64_t bytes, CopyKind kind) {
  // A copy from or to host memory inside a capture: the graph would copy, at each replay,
  // whatever the host buffer (or the staging slot) holds then, and the staging ring waits
  // on its slot's event, which a capture may not. The capture is refused (its work runs
  // eagerly); what a graph reads from the host goes in before the capture, as
  // MicroBatchGraphs places its inputs.
  if (kind != CopyKind::device_to_device && capturing())
    throw_refused("a {} byte copy {} host memory inside a CUDA graph capture (its value would be fixed at capture)",
                  bytes, kind == CopyKind::host_to_device ? "from" : "to");
  if (kind == CopyKind::host_to_device && bytes <= UploadStaging::kSlotBytes) return staging().upload(dst, src, bytes);
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), k, stream()));
  // Host memory is pageable and owned by the caller: wait so it may be reused at once.
  if (kind != CopyKind::device_to_device) CUDA_CHECK(cudaStreamSynchronize(stream()));
}

}  // namespace

int64_t async_uploads() { return staging().async_uploads(); }
int64_t pinned_host_bytes() { return pinned_cache().pinned_bytes(); }

void install_staging_hooks() {
  auto& h = cuda_allocator_hooks();
  h.copy = hook_copy;
  h.host_alloc = [](int64_t bytes) { return pinned_cache().alloc(bytes); };
  h.host_free = [](void* p, int64_t bytes) { pinned_cache().free(p, bytes); };
}

}  // namespace mtnlg::cuda
