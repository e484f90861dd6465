// The caching device allocator and the CUDA graph pools it serves captures from
// (allocator.cpp). Included by core/cuda/device.hpp, which every user of the CUDA backend
// includes; the stream-order rules the allocator relies on are described there.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <utility>

namespace mtnlg::cuda {

// ---- caching allocator -----------------------------------------------------------
// Requests are rounded to a size class (512 B granules up to 1 MiB, 2 MiB granules
// above) and served from that class's free list when it has a block; otherwise from
// cudaMalloc. When cudaMalloc fails outside a training step, every cached block is
// released and the call is retried once; a second failure throws RuntimeError naming the
// request and the counters. Inside a step (a DeviceStepScope, core/tensor.hpp, is alive)
// it throws at once: releasing means cudaFree, which waits for the whole device, and with
// NCCL collectives in flight whose peers wait for this rank's next launch that wait never
// ends; the rank fails instead and the job's abort path takes the peers down.
// Thread-safe (one mutex).
struct MemoryStats {
  int64_t current_bytes = 0;     // held by live allocations (rounded sizes)
  int64_t peak_bytes = 0;        // max of current_bytes since start / reset_peak_memory()
  int64_t reserved_bytes = 0;    // obtained from cudaMalloc and not yet released (live + cached)
  int64_t device_allocs = 0;     // cudaMalloc calls
  int64_t cache_hits = 0;        // requests served from a free list
  int64_t deferred_frees = 0;    // frees of blocks used on a side stream (record_stream)
  int64_t pending_blocks = 0;    // of those, blocks whose side-stream work is not known done yet
  int64_t graph_pool_bytes = 0;  // held by CUDA graph pools (GraphPool), counted in current_bytes
};
MemoryStats memory_stats();
void reset_peak_memory();
void empty_cache();  // cudaFree every cached (free) block

int64_t allocation_size_class(int64_t bytes);
// Exact mode: every block is exactly its request (no size classes), so an overrun
// reaches the end of the cudaMalloc'd block (on the emulator: a guard page; on a GPU:
// what compute-sanitizer watches), and a freed block is filled with 0xFF bytes (NaN) on
// the stream before reuse. On by default in the emulated build; MTNLG_CUDA_EXACT_ALLOC=1
// (or 0) in the environment overrides. Read once.
bool exact_allocations();

void* device_alloc(int64_t bytes);
void device_free(void* p);
// Stream awareness: `p` (anywhere inside a live block) is used by work queued on side
// stream `s` (NCCL sends and overlapped collectives). When the block is freed it is not
// handed out again until the work queued on `s` up to the free is done (an event per
// side stream, polled by later allocations), so a tensor may be dropped while a side
// stream still reads it. Work on the backend stream needs no call (stream order).
void record_stream(const void* p, cudaStream_t s);
// A typed device buffer from the caching allocator (scratch space inside launchers).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t n) : n_(n), p_(static_cast<T*>(device_alloc(n * static_cast<int64_t>(sizeof(T))))) {}
  ~DeviceBuffer() {
    if (p_) device_free(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : n_(std::exchange(o.n_, 0)), p_(std::exchange(o.p_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data() const { return p_; }
  int64_t size() const { return n_; }

 private:
  int64_t n_ = 0;
  T* p_ = nullptr;
};

// ---- CUDA graphs ------------------------------------------------------------------
// A private pool of the caching allocator for work captured into CUDA graphs. While a
// capture runs (CudaGraph's constructor), every allocation is served from the pool being
// captured into, and every block freed is kept by that pool, whether the pool handed it
// out or not: a replay writes and reads the very addresses the capture used, so none of
// them may be handed to other work while the pool lives. Captures that share a pool must
// be replayed in the order they were captured, on the backend stream (a block one capture
// freed may be another's). The pool's blocks count as in use (memory_stats().current_bytes)
// for as long as the pool lives; destroying it (after its graphs) returns the free ones to
// the cache. A block of the pool still held by a tensor when the pool goes becomes an
// ordinary block.
class GraphPool {
 public:
  GraphPool();
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  int64_t bytes() const;       // device memory the pool holds
  int64_t live_bytes() const;  // of those, blocks handed out and not freed yet
  struct State;

 private:
  friend class CudaGraph;
  State* state_;
};

// The work `work` queues on the backend stream, captured into a CUDA graph and
// instantiated; nothing of it runs during the capture. The capture is in thread-local mode
// (cudaStreamCaptureModeThreadLocal): this thread's work must not synchronise, query
// events, allocate from the driver or copy through pageable host memory (the runtime
// refuses each, and the capture fails) and must queue nothing on other streams; other
// threads (NCCL's, a checkpoint writer's) are not held to that while it runs, as global
// mode would. Only the pool's own growth calls cudaMalloc, with the mode relaxed for that
// call.
// Kernel arguments are fixed at capture: what changes between replays must be read from
// device memory the caller rewrites before launch(). A failed capture throws
// RuntimeError naming the runtime's error; nothing stays captured.
class CudaGraph {
 public:
  CudaGraph(GraphPool& pool, const std::function<void()>& work);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void launch() const;  // one replay, queued on the backend stream

 private:
  cudaGraphExec_t exec_ = nullptr;
};
// True while this thread captures (the step-parts marks and op profile stay off then).
bool capturing();
// CudaGraph::launch calls since start-up.
int64_t graph_launches();

// Installs device_alloc / device_free and the step scope into cuda_allocator_hooks()
// (core/tensor.hpp); called by init_backend.
void install_allocator_hooks();

}  // namespace mtnlg::cuda
