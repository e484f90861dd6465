// The emulated CUDA backend's internal interface: what the runtime (runtime.cpp), the
// SIMT executor (simt.cpp), cuBLASLt/cuBLAS (cublas.cpp), cuDNN (cudnn.cpp) and NCCL
// (nccl.cpp) share. Nothing outside emulator/ includes this but the emulator's own tests
// (test/emulator/); mtnlg's own code sees only the CUDA, cuBLAS and NCCL headers of the
// toolkit, whose functions this library defines.
//
// Model. Each stream is a FIFO of Ops. Nothing runs when it is enqueued: a stream runs
// only when a synchronisation forces it (cudaStreamSynchronize, cudaEventSynchronize,
// a copy to pageable host memory, cudaDeviceSynchronize, cudaFree), and then only the
// work the forced point depends on (its own stream up to it, and through
// cudaStreamWaitEvent the other streams up to the recorded events). Work another stream
// queued without an event is therefore NOT run first, so a missing wait reads stale
// (NaN-filled) memory instead of passing by luck. The one exception is communication:
// while an NCCL op waits for a peer, every stream may run (as every stream does on a
// GPU), so no emulated-only deadlock appears.
//
// A stream that captures a CUDA graph (cudaStreamBeginCapture) queues nothing: every op
// enqueued on it is recorded into the graph, and cudaGraphLaunch queues copies of the
// recorded ops, in order, on the stream it is given (docs/specs/cuda-emulation.md,
// "Stream capture and graphs").
//
// Device memory lives in its own mappings, inaccessible (PROT_NONE) except while the
// emulator runs queued work: a host dereference of a device pointer faults and the
// SIGSEGV handler names the allocation; each allocation ends at a guard page, so a
// kernel's out-of-bounds access faults and the handler names the kernel and the
// allocation. New allocations are filled with 0xFF bytes (NaN in f64, f32, bf16, f16).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mtnlg::emu {

// Prints "mtnlg cuda-emulator: <msg>" to stderr and aborts the process (the emulated
// equivalent of a device fault: the context is lost).
[[noreturn]] void fatal(const std::string& msg);

// Memory an op reads or writes, noted when it is enqueued, so that a replay of a CUDA
// graph that captured the op can check that the memory is still allocated (the same
// allocation, not a later one at the same address).
struct MemoryUse {
  const void* p = nullptr;
  size_t bytes = 0;     // 0: the pointer alone (a kernel's argument, whose extent is unknown)
  uint64_t alloc = 0;   // the device allocation's number; 0 for pinned host memory
  bool pinned = false;  // cudaHostAlloc'd host memory (an async copy's host side)
  std::string what;
};

// One unit of queued work.
struct Op {
  std::string name;  // for diagnostics: "kernel gelu_kernel<float>", "ncclAllReduce", "cublasLtMatmul"
  // Runs the op (device memory is accessible, the emulator lock is held). Returns true
  // when the op has finished. Ops that cannot block finish on the first call; an op
  // that waits on a peer (NCCL) returns false until its communication is complete and
  // is called again later (set `communication`).
  std::function<bool()> step;
  bool communication = false;
  // Runtime-internal (cudaStreamWaitEvent): the op waits until stream `wait_stream`
  // has finished `wait_seq` ops; the scheduler runs that stream up to there first.
  cudaStream_t wait_stream = nullptr;
  uint64_t wait_seq = 0;
  // Optional: builds `step` when the op is queued to run (by enqueue(), and again by every
  // cudaGraphLaunch of a graph that captured it), for an op whose state must be fresh for
  // each execution or whose place in an order is taken when it is queued (NCCL's
  // per-communicator order). When set, enqueue() replaces `step` with arm().
  std::function<std::function<bool()>()> arm{};
  // Device (and pinned) memory the op uses; see MemoryUse. Filled by enqueue() from the
  // ranges check_device_range accepted inside the caller's UseCollector, by launch()
  // from a kernel's pointer arguments, and by the async copies.
  std::vector<MemoryUse> uses{};
};

// Appends `op` to stream `s` (nullptr: the legacy default stream). Never runs it. While
// `s` captures a CUDA graph (cudaStreamBeginCapture) the op is recorded into the graph
// instead; on a capture that a refused call invalidated, or on the legacy stream while a
// blocking stream captures, it is dropped and the error is set (cudaGetLastError).
void enqueue(cudaStream_t s, Op op);

// Runs `s` until everything enqueued on it so far has finished (a fatal error while `s`
// captures a graph: nothing recorded there can run).
void force(cudaStream_t s);

// While one lives on a thread, the ranges check_device_range accepts on that thread are
// collected; take() hands them to an op's `uses`. A library declares one at the top of a
// call that checks its operands and then enqueues an op.
class UseCollector {
 public:
  UseCollector();
  ~UseCollector();
  UseCollector(const UseCollector&) = delete;
  UseCollector& operator=(const UseCollector&) = delete;
  std::vector<MemoryUse> take();
  void add(MemoryUse u) { uses_.push_back(std::move(u)); }

 private:
  UseCollector* outer_;
  std::vector<MemoryUse> uses_;
};

// CUDA graphs (stream capture): how many cudaGraphLaunch calls were accepted, and how
// many recorded ops they queued, since the process started.
int64_t graph_launches();
int64_t graph_ops_replayed();

// Checks that [p, p + bytes) lies inside one live device allocation; otherwise a fatal
// error "<what>: ... " naming the nearest allocation. bytes == 0 checks nothing.
void check_device_range(const void* p, size_t bytes, const char* what);
// True when p points into a live device allocation.
bool is_device_pointer(const void* p);
// True when p points into memory from cudaHostAlloc / cudaMallocHost (pinned).
bool is_pinned_host_pointer(const void* p);

// The sticky "last error" that cudaGetLastError / cudaPeekAtLastError report.
void set_last_error(cudaError_t e);

// Fault injection for tests (environment, read at each call):
//   MTNLG_EMU_LT_FAIL=1   every cuBLASLt heuristic candidate fails to run
//                         (CUBLAS_STATUS_NOT_SUPPORTED), so the cublasGemmEx fallback runs.
//   MTNLG_EMU_LT_FAIL=epilogues   the heuristic answers CUBLAS_STATUS_INVALID_VALUE to
//                         every call with an epilogue (as a GPU's cuBLASLt may refuse one).
//   MTNLG_EMU_NCCL_FAULT=rank=R:op=N:error=remote|system   on world rank R the N-th NCCL
//                         operation queued to run fails asynchronously (nccl.cpp): its
//                         communicator's ncclCommGetAsyncError reports the error and its
//                         operations never complete, until ncclCommAbort.
//   MTNLG_EMU_NCCL_FAULT=rank=R:init=N   rank R's N-th communicator initialisation never
//                         joins its group (non-blocking: ncclInProgress on every member).
//   MTNLG_EMU_CAPTURE_FAIL=1   every stream capture ends invalidated
//                         (cudaErrorStreamCaptureInvalidated, no graph), as if a library
//                         had made a call the runtime refuses during capture.
bool lt_candidates_fail();
bool lt_refuse_epilogues();

}  // namespace mtnlg::emu
