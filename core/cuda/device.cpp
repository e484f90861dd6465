// RAII CUDA resources, the caching allocator and the backend state (device.hpp).
// Host code only (no kernels), so it is a .cpp built by the host compiler.
#include "core/cuda/device.hpp"

#include <cublas_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/backend_kind.hpp"
#include "core/cuda/cuda_check.hpp"
#include "core/error.hpp"
#include "core/switches.hpp"
#include "core/tensor.hpp"

namespace mtnlg::cuda {

// ---- RAII ------------------------------------------------------------------------

CudaStream::CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
CudaStream::~CudaStream() {
  if (s_) cudaStreamDestroy(s_);  // no throw from a destructor
}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  std::swap(s_, o.s_);
  return *this;
}
void CudaStream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

CudaEvent::CudaEvent(bool timing) {
  CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() {
  if (e_) cudaEventDestroy(e_);
}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  std::swap(e_, o.e_);
  return *this;
}
void CudaEvent::record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }
void CudaEvent::synchronize() const { CUDA_CHECK(cudaEventSynchronize(e_)); }
float CudaEvent::elapsed_ms(const CudaEvent& start) const {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

CublasLtHandle::CublasLtHandle() { CUBLAS_CHECK(cublasLtCreate(&h_)); }
CublasLtHandle::~CublasLtHandle() {
  if (h_) cublasLtDestroy(h_);
}
CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&& o) noexcept {
  std::swap(h_, o.h_);
  return *this;
}

// ---- caching allocator -----------------------------------------------------------

namespace {

constexpr int64_t kSmallLimit = 1 << 20, kSmallGranule = 512, kLargeGranule = 2 << 20;

}  // namespace

// A graph pool's blocks (device.hpp, GraphPool).
struct GraphPool::State {
  std::unordered_map<int64_t, std::vector<void*>> free;  // size class -> blocks free in the pool
  std::vector<std::pair<void*, int64_t>> blocks;         // every block the pool holds
  int64_t bytes = 0, live_bytes = 0;
};

namespace {

class CachingAllocator {
 public:
  std::atomic<int> step_depth_{0};  // live DeviceStepScopes (no cache release while > 0)

  void* alloc(int64_t bytes) {
    const int64_t size = exact_allocations() ? std::max<int64_t>(bytes, 1) : allocation_size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (capture_) return alloc_in_pool_locked(size, bytes);
    collect_pending_locked(/*wait=*/false);
    void* p = take_free_locked(free_, size);
    if (!p) {
      cudaError_t e = cudaMalloc(&p, static_cast<size_t>(size));
      const bool in_step = step_depth_.load() > 0;
      if (e == cudaErrorMemoryAllocation && !in_step) {
        cudaGetLastError();  // clear the sticky-free error state of the failed call
        release_cached_locked();
        e = cudaMalloc(&p, static_cast<size_t>(size));
      }
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw_runtime("CUDA out of memory{}: cannot allocate {} bytes (size class {}) on device {}: {} bytes in use, {} "
                      "reserved, peak {} ({}); lower training.micro_batch_size, or set "
                      "parallel.recompute_granularity: selective or full",
                      in_step ? " during a training step (the cache is not released mid-step: that would wait on "
                                "collectives in flight)"
                              : "",
                      bytes, size, backend_device(), stats_.current_bytes, stats_.reserved_bytes, stats_.peak_bytes,
                      cudaGetErrorString(e));
      }
      ++stats_.device_allocs;
      stats_.reserved_bytes += size;
    }
    live_[static_cast<char*>(p)] = Block{size, {}};
    stats_.current_bytes += size;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
    return p;
  }

  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<char*>(p));
    if (it == live_.end()) return;  // not ours (defensive: never double-free into the cache)
    if (GraphPool::State* pool = it->second.pool ? it->second.pool : capture_) {
      // The block stays reserved for the graphs: back to its pool, or, freed during a
      // capture, into the captured pool.
      if (it->second.pool)
        pool->live_bytes -= it->second.size;
      else
        adopt_locked(p, it->second.size);
      poison_locked(p, it->second.size);
      pool->free[it->second.size].push_back(p);
      live_.erase(it);
      return;
    }
    stats_.current_bytes -= it->second.size;
    if (it->second.streams.empty()) {
      // Exact mode poisons the block in stream order: a later user that reads before
      // writing sees NaN, not the previous tensor's values. (No throw: a destructor path.)
      poison_locked(p, it->second.size);
      free_[it->second.size].push_back(p);
    } else {
      // Used on side streams: reusable once the work queued there so far is done. free()
      // runs in destructors, so nothing here throws: without an event, wait for the
      // stream instead.
      Pending pend{p, it->second.size, {}};
      for (cudaStream_t s : it->second.streams) {
        cudaEvent_t e = take_event_locked();
        if (e && cudaEventRecord(e, s) == cudaSuccess) {
          pend.events.push_back(e);
        } else {
          cudaGetLastError();
          if (e) events_.push_back(e);
          cudaStreamSynchronize(s);
        }
      }
      pending_.push_back(std::move(pend));
      ++stats_.deferred_frees;
    }
    live_.erase(it);
  }

  void record_stream(const void* p, cudaStream_t s) {
    if (!p || s == stream()) return;  // the backend stream orders reuse by itself
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(static_cast<char*>(const_cast<void*>(p)));
    if (it == live_.begin()) return;
    --it;
    if (static_cast<const char*>(p) >= it->first + it->second.size) return;  // not inside one of our blocks
    auto& ss = it->second.streams;
    if (std::find(ss.begin(), ss.end(), s) == ss.end()) ss.push_back(s);
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

  // ---- graph pools (GraphPool, CudaGraph) ----
  void begin_capture(GraphPool::State* pool) {
    std::lock_guard<std::mutex> lock(mu_);
    MTNLG_CHECK(!capture_, "a CUDA graph capture is already running: captures do not nest");
    capture_ = pool;
  }
  void end_capture() {
    std::lock_guard<std::mutex> lock(mu_);
    capture_ = nullptr;
  }
  // The pool's free blocks go back to the cache; blocks still held by tensors become
  // ordinary blocks, freed as usual.
  void release_pool(GraphPool::State* pool) {
    std::lock_guard<std::mutex> lock(mu_);
    if (capture_ == pool) capture_ = nullptr;
    for (auto& [p, size] : pool->blocks) {
      auto it = live_.find(static_cast<char*>(p));
      if (it != live_.end()) {
        it->second.pool = nullptr;  // still in use: counted until its tensor frees it
      } else {
        free_[size].push_back(p);
        stats_.current_bytes -= size;
      }
      stats_.graph_pool_bytes -= size;
    }
    pool->blocks.clear();
    pool->free.clear();
    pool->bytes = pool->live_bytes = 0;
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    MemoryStats s = stats_;
    s.pending_blocks = static_cast<int64_t>(pending_.size());
    return s;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
  }

 private:
  struct Block {
    int64_t size = 0;
    std::vector<cudaStream_t> streams;  // side streams that used the block (record_stream)
    GraphPool::State* pool = nullptr;   // the graph pool it belongs to, if any
  };

  // Exact mode poisons a freed block in stream order: a later user that reads before
  // writing sees NaN, not the previous tensor's values (during a capture the poisoning is
  // part of the graph). No throw: a destructor path.
  void poison_locked(void* p, int64_t size) {
    if (exact_allocations() && backend_ready() && cudaMemsetAsync(p, 0xFF, static_cast<size_t>(size), stream()) != cudaSuccess)
      cudaGetLastError();
  }

  // A free block of `size` from `lists` (a cache hit), or null.
  void* take_free_locked(std::unordered_map<int64_t, std::vector<void*>>& lists, int64_t size) {
    auto it = lists.find(size);
    if (it == lists.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    ++stats_.cache_hits;
    return p;
  }

  // During a capture: from the captured pool's free blocks, else a new block for it
  // (nothing is released to make room).
  void* alloc_in_pool_locked(int64_t size, int64_t bytes) {
    GraphPool::State& pool = *capture_;
    void* p = take_free_locked(pool.free, size);
    if (!p) {
      // The capture's mode (thread-local) has the runtime refuse cudaMalloc (it may
      // synchronise): this thread relaxes the mode for the one call, as the pool's growth
      // is ordered by the capture itself.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      cudaThreadExchangeStreamCaptureMode(&mode);
      const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(size));
      cudaThreadExchangeStreamCaptureMode(&mode);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw_runtime("CUDA out of memory while capturing a CUDA graph: cannot allocate {} bytes (size class {}): {} "
                      "bytes in use, {} reserved ({}); set training.enable_cuda_graph: false, or lower "
                      "training.micro_batch_size",
                      bytes, size, stats_.current_bytes, stats_.reserved_bytes, cudaGetErrorString(e));
      }
      ++stats_.device_allocs;
      stats_.reserved_bytes += size;
      adopt_locked(p, size);
    }
    live_[static_cast<char*>(p)] = Block{size, {}, &pool};
    pool.live_bytes += size;
    return p;
  }

  // A block joins the captured pool (counted in use for the pool's life).
  void adopt_locked(void* p, int64_t size) {
    capture_->blocks.emplace_back(p, size);
    capture_->bytes += size;
    stats_.graph_pool_bytes += size;
    if (!live_.count(static_cast<char*>(p))) stats_.current_bytes += size;  // a new block (a freed one was counted)
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  }
  struct Pending {
    void* p = nullptr;
    int64_t size = 0;
    std::vector<cudaEvent_t> events;  // one per side stream; the block is free when all are done
  };

  cudaEvent_t take_event_locked() {
    if (!events_.empty()) {
      cudaEvent_t e = events_.back();
      events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;  // the caller waits for the stream instead
    }
    return e;
  }

  // Moves pending blocks whose side-stream work is done to the free lists (`wait`: wait
  // for all of them).
  void collect_pending_locked(bool wait) {
    for (size_t i = 0; i < pending_.size();) {
      bool done = true;
      for (cudaEvent_t e : pending_[i].events) {
        if (wait) {
          CUDA_CHECK(cudaEventSynchronize(e));
          continue;
        }
        const cudaError_t q = cudaEventQuery(e);
        if (q == cudaErrorNotReady) {
          done = false;
          break;
        }
        if (q != cudaSuccess) CUDA_CHECK(q);
      }
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t e : pending_[i].events) events_.push_back(e);
      free_[pending_[i].size].push_back(pending_[i].p);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  void release_cached_locked() {
    // Blocks in the free lists may still be read by queued kernels: drain the stream
    // (and the side-stream work of pending blocks) before giving them back to the driver.
    collect_pending_locked(/*wait=*/true);
    if (backend_ready()) cudaStreamSynchronize(stream());
    for (auto& [size, ptrs] : free_) {
      for (void* p : ptrs) {
        cudaFree(p);
        stats_.reserved_bytes -= size;
      }
      ptrs.clear();
    }
  }

  std::mutex mu_;
  std::unordered_map<int64_t, std::vector<void*>> free_;  // size class -> free blocks
  std::map<char*, Block> live_;                           // block start -> size, side streams
  std::vector<Pending> pending_;                          // freed, side-stream work outstanding
  std::vector<cudaEvent_t> events_;                       // recycled events
  MemoryStats stats_;
  GraphPool::State* capture_ = nullptr;                   // the pool a running capture allocates from
};

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

CachingAllocator& allocator() {
  static auto* a = new CachingAllocator;  // leaked on purpose, see device.hpp
  return *a;
}

struct Backend {
  int device = -1;
  CudaStream stream;
  CublasLtHandle lt;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  std::string name;
};
Backend* g_backend = nullptr;  // set once by init_backend, never destroyed
std::mutex g_backend_mu;

Backend& backend() {
  if (!g_backend) throw_runtime("the CUDA backend is not initialised: call cuda::init_backend(device) first");
  return *g_backend;
}

void hook_copy(void* dst, const void* src, int64_t bytes, CopyKind kind) {
  if (kind == CopyKind::host_to_device && bytes <= UploadStaging::kSlotBytes) return staging().upload(dst, src, bytes);
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), k, stream()));
  // Host memory is pageable and owned by the caller: wait so it may be reused at once.
  if (kind != CopyKind::device_to_device) CUDA_CHECK(cudaStreamSynchronize(stream()));
}

}  // namespace

bool exact_allocations() {
  // Default: on under the emulated CUDA backend, off on a GPU.
  static const bool on = switches::flag(Switch::cuda_exact_alloc).value_or(emulated_backend());
  return on;
}

int64_t allocation_size_class(int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 1);
  if (bytes <= kSmallLimit) return (bytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
  return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

MemoryStats memory_stats() { return allocator().stats(); }
void reset_peak_memory() { allocator().reset_peak(); }
void empty_cache() { allocator().release_cached(); }
void* device_alloc(int64_t bytes) { return allocator().alloc(bytes); }
void device_free(void* p) { allocator().free(p); }
void record_stream(const void* p, cudaStream_t s) { allocator().record_stream(p, s); }
int64_t async_uploads() { return staging().async_uploads(); }
int64_t pinned_host_bytes() { return pinned_cache().pinned_bytes(); }

// ---- CUDA graphs ------------------------------------------------------------------

namespace {
thread_local bool t_capturing = false;
std::atomic<int64_t> g_graph_launches{0};
}  // namespace

GraphPool::GraphPool() : state_(new State) {}
GraphPool::~GraphPool() {
  allocator().release_pool(state_);
  delete state_;
}
int64_t GraphPool::bytes() const { return state_->bytes; }
int64_t GraphPool::live_bytes() const { return state_->live_bytes; }

CudaGraph::CudaGraph(GraphPool& pool, const std::function<void()>& work) {
  const cudaStream_t s = stream();
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaSuccess;
  {
    // While the work is captured: the allocator serves the pool, and this thread says so.
    // Set before the runtime's capture begins (a nested capture throws here, with nothing
    // begun), cleared however the capture ends.
    struct Capturing {
      explicit Capturing(GraphPool::State* p) {
        allocator().begin_capture(p);
        t_capturing = true;
      }
      ~Capturing() {
        t_capturing = false;
        allocator().end_capture();
      }
    } capturing(pool.state_);
    e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw_runtime("cannot start a CUDA graph capture on the compute stream: {}", cudaGetErrorString(e));
    }
    try {
      work();
    } catch (...) {
      if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    e = cudaStreamEndCapture(s, &graph);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    throw_runtime("CUDA graph capture failed: {} ({}): the captured work synchronised, queried, copied through "
                  "pageable host memory or used another stream",
                  cudaGetErrorString(e), cudaGetErrorName(e));
  }
  e = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    exec_ = nullptr;
    throw_runtime("cannot instantiate the captured CUDA graph: {}", cudaGetErrorString(e));
  }
}

CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

void CudaGraph::launch() const {
  CUDA_CHECK(cudaGraphLaunch(exec_, stream()));
  ++g_graph_launches;
}

bool capturing() { return t_capturing; }
int64_t graph_launches() { return g_graph_launches.load(); }

// ---- backend ---------------------------------------------------------------------

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int device_for_local_rank(int64_t local_rank) {
  const int n = device_count();
  if (n == 0) throw_runtime("no CUDA device is visible (CUDA_VISIBLE_DEVICES='{}')", [] {
      const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
      return std::string(v ? v : "<unset>");
    }());
  return static_cast<int>(local_rank % n);
}

void init_backend(int device) {
  std::lock_guard<std::mutex> lock(g_backend_mu);
  if (g_backend) {
    if (g_backend->device != device)
      throw_runtime("the CUDA backend already runs on device {}; cannot switch to device {}", g_backend->device, device);
    return;
  }
  const int n = device_count();
  if (device < 0 || device >= n) throw_runtime("CUDA device {} does not exist ({} visible)", device, n);
  CUDA_CHECK(cudaSetDevice(device));
  auto b = std::make_unique<Backend>();
  b->device = device;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  b->name = fmt::format("{} (sm_{}{})", prop.name, prop.major, prop.minor);
  // 32 MiB: what cuBLASLt's heuristics want for large Hopper GEMMs.
  b->workspace_bytes = 32 << 20;
  CUDA_CHECK(cudaMalloc(&b->workspace, static_cast<size_t>(b->workspace_bytes)));
  g_backend = b.release();
  auto& h = cuda_allocator_hooks();
  h.alloc = [](int64_t bytes) { return device_alloc(bytes); };
  h.free = [](void* p) { device_free(p); };
  h.copy = hook_copy;
  h.host_alloc = [](int64_t bytes) { return pinned_cache().alloc(bytes); };
  h.host_free = [](void* p, int64_t bytes) { pinned_cache().free(p, bytes); };
  h.step_scope = [](int delta) { allocator().step_depth_ += delta; };
}

bool backend_ready() { return g_backend != nullptr; }
int backend_device() { return g_backend ? g_backend->device : -1; }
cudaStream_t stream() { return backend().stream.get(); }
cublasLtHandle_t cublaslt() { return backend().lt.get(); }
void* cublas_workspace() { return backend().workspace; }
int64_t cublas_workspace_bytes() { return backend().workspace_bytes; }
void synchronize() { backend().stream.synchronize(); }
const char* device_name() { return backend().name.c_str(); }

}  // namespace mtnlg::cuda
