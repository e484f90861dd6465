// The caching device allocator and the CUDA graph pools (allocator.hpp). Host code only
// (no kernels), so it is a .cpp built by the host compiler.
#include "core/cuda/allocator.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/backend_kind.hpp"
#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#include "core/error.hpp"
#include "core/refused.hpp"
#include "core/switches.hpp"
#include "core/tensor.hpp"

namespace mtnlg::cuda {

// ---- caching allocator -----------------------------------------------------------

namespace {

constexpr int64_t kSmallLimit = 1 << 20, kSmallGranule = 512, kLargeGranule = 2 << 20;

}  // namespace

// A graph pool's blocks (allocator.hpp, GraphPool).
struct GraphPool::State {
  std::unordered_map<int64_t, std::vector<void*>> free;  // size class -> blocks free in the pool
  std::vector<std::pair<void*, int64_t>> blocks;         // every block the pool holds
  int64_t bytes = 0, live_bytes = 0;
};

namespace {

// The pool a CUDA graph capture of this thread allocates from (CudaGraph): per thread, as
// the capture is (thread-local mode): other threads' allocations during it are ordinary.
thread_local GraphPool::State* t_capture_pool = nullptr;

class CachingAllocator {
 public:
  std::atomic<int> step_depth_{0};  // live DeviceStepScopes (no cache release while > 0)

  void* alloc(int64_t bytes) {
    const int64_t size = exact_allocations() ? std::max<int64_t>(bytes, 1) : allocation_size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (t_capture_pool) return alloc_in_pool_locked(size, bytes);
    collect_pending_locked(/*wait=*/false);
    void* p = take_free_locked(free_, size);
    if (!p) p = device_malloc_locked(size, bytes, Growth::cache);
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
    if (GraphPool::State* pool = it->second.pool ? it->second.pool : t_capture_pool) {
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
    MTNLG_CHECK(!t_capture_pool, "a CUDA graph capture is already running on this thread: captures do not nest");
    t_capture_pool = pool;
  }
  void end_capture() { t_capture_pool = nullptr; }
  // The pool's free blocks go back to the cache; blocks still held by tensors become
  // ordinary blocks, freed as usual.
  void release_pool(GraphPool::State* pool) {
    std::lock_guard<std::mutex> lock(mu_);
    if (t_capture_pool == pool) t_capture_pool = nullptr;
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
    if (exact_allocations() && backend_ready() &&
        cudaMemsetAsync(p, 0xFF, static_cast<size_t>(size), stream()) != cudaSuccess)
      cudaGetLastError();
  }

  // What a new block from cudaMalloc is for: the cache (outside a capture: on failure the
  // cached blocks are released and the call retried, unless a step is running) or the
  // pool of the graph being captured (the capture's mode relaxed for the call; nothing is
  // released to make room).
  enum class Growth { cache, graph_pool };

  // A new block of `size` bytes (the request was `bytes`) from cudaMalloc, counted as
  // reserved. Out of memory throws RuntimeError naming the request, the counters and what
  // to change.
  void* device_malloc_locked(int64_t size, int64_t bytes, Growth growth) {
    void* p = nullptr;
    cudaError_t e = cudaSuccess;
    const bool in_step = step_depth_.load() > 0;
    if (growth == Growth::graph_pool) {
      // The capture's mode (thread-local) has the runtime refuse cudaMalloc (it may
      // synchronise): this thread relaxes the mode for the one call, as the pool's growth
      // is ordered by the capture itself.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      cudaThreadExchangeStreamCaptureMode(&mode);
      e = cudaMalloc(&p, static_cast<size_t>(size));
      cudaThreadExchangeStreamCaptureMode(&mode);
    } else {
      e = cudaMalloc(&p, static_cast<size_t>(size));
      if (e == cudaErrorMemoryAllocation && !in_step) {
        cudaGetLastError();  // clear the sticky-free error state of the failed call
        release_cached_locked();
        e = cudaMalloc(&p, static_cast<size_t>(size));
      }
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      const bool capture = growth == Growth::graph_pool;
      throw_runtime(
          "CUDA out of memory{}: cannot allocate {} bytes (size class {}) on device {}: {} bytes in use, {} "
          "reserved, peak {} ({}); {}",
          capture   ? " while capturing a CUDA graph"
          : in_step ? " during a training step (the cache is not released mid-step: that would wait on "
                      "collectives in flight)"
                    : "",
          bytes, size, backend_device(), stats_.current_bytes, stats_.reserved_bytes, stats_.peak_bytes,
          cudaGetErrorString(e),
          capture ? "set training.enable_cuda_graph: false, or lower training.micro_batch_size"
                  : "lower training.micro_batch_size, or set parallel.recompute_granularity: selective or "
                    "full");
    }
    ++stats_.device_allocs;
    stats_.reserved_bytes += size;
    return p;
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
    GraphPool::State& pool = *t_capture_pool;
    void* p = take_free_locked(pool.free, size);
    if (!p) {
      p = device_malloc_locked(size, bytes, Growth::graph_pool);
      adopt_locked(p, size);
    }
    live_[static_cast<char*>(p)] = Block{size, {}, &pool};
    pool.live_bytes += size;
    return p;
  }

  // A block joins the captured pool (counted in use for the pool's life).
  void adopt_locked(void* p, int64_t size) {
    t_capture_pool->blocks.emplace_back(p, size);
    t_capture_pool->bytes += size;
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
};

CachingAllocator& allocator() {
  static auto* a = new CachingAllocator;  // leaked on purpose, see device.hpp
  return *a;
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

void install_allocator_hooks() {
  auto& h = cuda_allocator_hooks();
  h.alloc = [](int64_t bytes) { return device_alloc(bytes); };
  h.free = [](void* p) { device_free(p); };
  h.step_scope = [](int delta) { allocator().step_depth_ += delta; };
}

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
      throw_refused("cannot start a CUDA graph capture on the compute stream: {}", cudaGetErrorString(e));
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
    throw_refused(
        "CUDA graph capture failed: {} ({}): the captured work synchronised, queried, copied through "
        "pageable host memory or used another stream",
        cudaGetErrorString(e), cudaGetErrorName(e));
  }
  e = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    exec_ = nullptr;
    throw_refused("cannot instantiate the captured CUDA graph: {}", cudaGetErrorString(e));
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

}  // namespace mtnlg::cuda
