// CUDA graphs by stream capture on the emulated CUDA backend: what a capture records and a
// replay runs, and every call the runtime refuses during a capture (with its code, and
// the capture invalidated); fork and join through events. The fatal cases (a replay
// touching freed memory, a launch into a capture) are planted cases of emu_planted
// (planted.cu).
// Compiled like core/cuda/*.cu: as C++ with emulator/cuda_emu.hpp force-included.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cublas_v2.h>
#include <nccl.h>

#include "emulator/emu.hpp"

namespace {

__global__ void scale_kernel(const float* in, float* out, int n, float a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i];
}
__global__ void add_kernel(const float* in, float* acc, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += in[i];
}
__global__ void fill_kernel(float* x, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}

constexpr int kN = 1000;
constexpr size_t kBytes = kN * sizeof(float);

float* dalloc(size_t n = kN) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
  return static_cast<float*>(p);
}
std::vector<float> to_host(const float* d, size_t n = kN) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}
cudaStream_t new_stream(unsigned flags = cudaStreamNonBlocking) {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, flags) == cudaSuccess);
  return s;
}
void host_count(void* p) { ++*static_cast<int*>(p); }

// Ends the capture on `s`, which a refused call must have invalidated: no graph, the
// code cudaErrorStreamCaptureInvalidated, and the stream usable again afterwards.
void expect_invalidated_end(cudaStream_t s, float* x) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusInvalidated);
  // Further work on the invalidated capture is refused too.
  MTNLG_LAUNCH(4, 256, 0, s, fill_kernel)(x, kN, 3.0f);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
  cudaGraph_t g = reinterpret_cast<cudaGraph_t>(0x1);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  CHECK(g == nullptr);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusNone);
  MTNLG_LAUNCH(4, 256, 0, s, fill_kernel)(x, kN, 5.0f);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(to_host(x)[7] == 5.0f);
}

}  // namespace

TEST_CASE("graphs: a capture records without running, and each replay runs it with the pinned input of its time",
          "[emulator][graphs]") {
  float* pinned = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kBytes, cudaHostAllocDefault) == cudaSuccess);
  for (int i = 0; i < kN; ++i) pinned[i] = static_cast<float>(i);
  float *x = dalloc(), *y = dalloc(), *z = dalloc();
  cudaStream_t s = new_stream();
  int host_calls = 0;
  const int64_t launches0 = mtnlg::emu::graph_launches(), replayed0 = mtnlg::emu::graph_ops_replayed();

  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(x, pinned, kBytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
  MTNLG_LAUNCH(4, 256, 0, s, scale_kernel)(x, y, kN, 2.0f);
  REQUIRE(cudaMemsetAsync(z, 0, kBytes, s) == cudaSuccess);
  MTNLG_LAUNCH(4, 256, 0, s, add_kernel)(y, z, kN);
  MTNLG_LAUNCH(4, 256, 0, s, add_kernel)(y, z, kN);
  REQUIRE(cudaLaunchHostFunc(s, host_count, &host_calls) == cudaSuccess);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusActive);
  unsigned long long id = 0;
  cudaGraph_t building = nullptr;
  size_t deps = 99;
  REQUIRE(cudaStreamGetCaptureInfo(s, &st, &id, &building, nullptr, nullptr, &deps) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusActive);
  CHECK(id != 0);
  CHECK(building != nullptr);
  CHECK(deps == 1);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  CHECK(graph == building);
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusNone);

  // Nothing ran: the buffers still hold the allocation's NaN fill, the host function
  // was not called, and no graph was launched.
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(std::isnan(to_host(x)[5]));
  CHECK(std::isnan(to_host(z)[5]));
  CHECK(host_calls == 0);
  CHECK(mtnlg::emu::graph_launches() == launches0);

  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);  // the exec keeps its own copy
  REQUIRE(cudaGraphUpload(exec, s) == cudaSuccess);

  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  auto h = to_host(z);
  CHECK(h[0] == 0.0f);
  CHECK(h[10] == 40.0f);
  CHECK(h[kN - 1] == 4.0f * (kN - 1));
  CHECK(host_calls == 1);

  // The copy node reads the pinned buffer when the graph runs: a new input each replay.
  for (int i = 0; i < kN; ++i) pinned[i] = static_cast<float>(10 + i);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  h = to_host(z);
  CHECK(h[0] == 40.0f);
  CHECK(h[10] == 80.0f);
  CHECK(host_calls == 2);
  CHECK(mtnlg::emu::graph_launches() == launches0 + 2);
  CHECK(mtnlg::emu::graph_ops_replayed() == replayed0 + 12);

  SECTION("a launch on another stream is ordered behind the exec's previous launch") {
    cudaStream_t s2 = new_stream();
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s2) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);  // forces s's launch first
    CHECK(host_calls == 4);
    REQUIRE(cudaStreamDestroy(s2) == cudaSuccess);
  }
  SECTION("destroying the exec leaves its queued replay to run; launching it afterwards is refused") {
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(host_calls == 3);
    CHECK(cudaGraphLaunch(exec, s) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    exec = nullptr;
  }
  if (exec) REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaFree(x) == cudaSuccess);
  REQUIRE(cudaFree(y) == cudaSuccess);
  REQUIRE(cudaFree(z) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
}

TEST_CASE("graphs: a library call on the capturing stream is recorded too (cuBLAS)", "[emulator][graphs]") {
  // C (2x2) = A (2x3) B (3x2), column-major; replayed twice with A changed on the device.
  float *a = dalloc(6), *b = dalloc(6), *c = dalloc(4);
  const float ha[6] = {1, 2, 3, 4, 5, 6}, hb[6] = {1, 0, 0, 1, 1, 1};
  REQUIRE(cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice) == cudaSuccess);
  cudaStream_t s = new_stream();
  cublasHandle_t handle = nullptr;
  REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasSetStream(handle, s) == CUBLAS_STATUS_SUCCESS);
  // A workspace of its own, set after the stream (which resets it): without one cuBLAS would
  // allocate its default workspace inside the graph, which the emulator refuses.
  constexpr size_t kWorkspace = size_t{1} << 20;
  void* ws = nullptr;
  REQUIRE(cudaMalloc(&ws, kWorkspace) == cudaSuccess);
  REQUIRE(cublasSetWorkspace(handle, ws, kWorkspace) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, a, CUDA_R_32F, 2, b, CUDA_R_32F, 3, &zero, c,
                       CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  CHECK(std::isnan(to_host(c, 4)[0]));  // not run by the capture
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  // C[:,0] = A[:,0] = (1,2); C[:,1] = A[:,0] + A[:,1] + A[:,2] = (1+3+5, 2+4+6).
  auto h = to_host(c, 4);
  CHECK(h == std::vector<float>{1, 2, 9, 12});
  MTNLG_LAUNCH(1, 32, 0, s, fill_kernel)(a, 6, 1.0f);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  h = to_host(c, 4);
  CHECK(h == std::vector<float>{1, 1, 3, 3});
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cublasDestroy(handle) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaFree(ws) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  for (float* p : {a, b, c}) REQUIRE(cudaFree(p) == cudaSuccess);
}

TEST_CASE("graphs: a captured NCCL op takes its place in the communicator's order at each replay",
          "[emulator][graphs]") {
  // One rank: no MPI. A captured op must not take a place in the order when it is
  // recorded (an uncaptured op after it would wait for it for ever), and each replay
  // must communicate afresh.
  ncclUniqueId uid;
  REQUIRE(ncclGetUniqueId(&uid) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, uid, 0) == ncclSuccess);
  float* pinned = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kBytes, cudaHostAllocDefault) == cudaSuccess);
  float *in = dalloc(), *out = dalloc();
  cudaStream_t s = new_stream();
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(in, pinned, kBytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(ncclAllReduce(in, out, kN, ncclFloat32, ncclSum, comm, s) == ncclSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  MTNLG_LAUNCH(4, 256, 0, s, fill_kernel)(in, kN, 7.0f);
  REQUIRE(ncclAllReduce(in, out, kN, ncclFloat32, ncclSum, comm, s) == ncclSuccess);  // uncaptured
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(to_host(out)[3] == 7.0f);
  for (const float v : {1.0f, 2.0f}) {
    for (int i = 0; i < kN; ++i) pinned[i] = v;
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(to_host(out)[3] == v);
  }
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);  // every op it queued has posted
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaFree(in) == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
}

TEST_CASE("graphs: calls the runtime refuses during a capture invalidate it", "[emulator][graphs]") {
  float* x = dalloc();
  float* pinned = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kBytes, cudaHostAllocDefault) == cudaSuccess);
  std::vector<float> pageable(kN, 1.0f);
  cudaEvent_t outside = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming) == cudaSuccess);
  cudaStream_t other = new_stream();
  REQUIRE(cudaEventRecord(outside, other) == cudaSuccess);
  cudaStream_t s = new_stream();
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  MTNLG_LAUNCH(4, 256, 0, s, fill_kernel)(x, kN, 1.0f);
  REQUIRE(cudaGetLastError() == cudaSuccess);

  cudaError_t want = cudaErrorStreamCaptureUnsupported;
  cudaError_t got = cudaSuccess;
  SECTION("cudaMalloc") {
    void* p = reinterpret_cast<void*>(0x1);
    got = cudaMalloc(&p, 64);
    CHECK(p == nullptr);
  }
  SECTION("cudaMallocHost") {
    void* p = nullptr;
    got = cudaMallocHost(&p, 64);
  }
  SECTION("cudaFree") { got = cudaFree(x); }
  SECTION("cudaStreamSynchronize of the capturing stream") { got = cudaStreamSynchronize(s); }
  SECTION("cudaStreamQuery of the capturing stream") { got = cudaStreamQuery(s); }
  SECTION("cudaDeviceSynchronize") { got = cudaDeviceSynchronize(); }
  SECTION("synchronous cudaMemcpy") { got = cudaMemcpy(pageable.data(), x, kBytes, cudaMemcpyDeviceToHost); }
  SECTION("synchronous cudaMemset") { got = cudaMemset(x, 0, kBytes); }
  SECTION("cudaMemcpyAsync from pageable memory") {
    got = cudaMemcpyAsync(x, pageable.data(), kBytes, cudaMemcpyHostToDevice, s);
  }
  SECTION("cudaMemcpyAsync into pageable memory") {
    got = cudaMemcpyAsync(pageable.data(), x, kBytes, cudaMemcpyDeviceToHost, s);
  }
  SECTION("cudaEventSynchronize on an event recorded in the capture") {
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreate(&e) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, s) == cudaSuccess);  // allowed: marks a point of the graph
    want = cudaErrorCapturedEvent;
    got = cudaEventSynchronize(e);
  }
  SECTION("cudaEventQuery on an event recorded in the capture") {
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreate(&e) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s, e, 0) == cudaSuccess);  // the capturing stream itself may wait on it
    want = cudaErrorCapturedEvent;
    got = cudaEventQuery(e);
  }
  SECTION("cudaEventElapsedTime on an event recorded in the capture") {
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreate(&e) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
    float ms = 0;
    want = cudaErrorCapturedEvent;
    got = cudaEventElapsedTime(&ms, e, e);
  }
  SECTION("cudaEventSynchronize on an ordinary event (a potentially unsafe call)") {
    got = cudaEventSynchronize(outside);
  }
  SECTION("the capturing stream waits on an event recorded outside the capture") {
    want = cudaErrorStreamCaptureIsolation;
    got = cudaStreamWaitEvent(s, outside, 0);
  }
  CHECK(got == want);
  CHECK(cudaGetLastError() == want);
  expect_invalidated_end(s, x);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
  REQUIRE(cudaEventDestroy(outside) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  REQUIRE(cudaFree(x) == cudaSuccess);
}

// Fork and join: a second stream joins the capture by waiting on an event recorded in it,
// works as a branch of the graph, and is joined back by the capturing stream's wait on an
// event recorded on it. A replay runs the branch on a stream of the exec's own, ordered by
// the captured dependencies (context parallelism's send and receive streams, captured
// with a micro batch).
TEST_CASE("graphs: a stream that joins the capture by an event is a branch of the graph", "[emulator][graphs]") {
  cudaStream_t s = new_stream(), side = new_stream();
  cudaEvent_t fork = nullptr, join = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  float *x = dalloc(), *y = dalloc(), *acc = dalloc();
  int hosts = 0;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  MTNLG_LAUNCH(4, 256, 0, s, fill_kernel)(x, kN, 2.0f);
  REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);  // fork: the side stream joins
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(side, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusActive);
  MTNLG_LAUNCH(4, 256, 0, side, scale_kernel)(x, y, kN, 3.0f);  // reads what the fork point wrote
  REQUIRE(cudaLaunchHostFunc(side, host_count, &hosts) == cudaSuccess);
  MTNLG_LAUNCH(4, 256, 0, s, fill_kernel)(acc, kN, 1.0f);  // meanwhile on the capturing stream
  REQUIRE(cudaEventRecord(join, side) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s, join, 0) == cudaSuccess);  // join
  MTNLG_LAUNCH(4, 256, 0, s, add_kernel)(y, acc, kN);       // after the branch
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
  REQUIRE(cudaStreamIsCapturing(side, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusNone);
  CHECK(hosts == 0);  // nothing ran
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
  for (int launch = 1; launch <= 2; ++launch) {
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(to_host(acc)[kN - 1] == 7.0f);  // 1 + 3 x 2
    CHECK(hosts == launch);
  }
  // The side stream works on its own again after the capture.
  MTNLG_LAUNCH(4, 256, 0, side, fill_kernel)(y, kN, 9.0f);
  REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
  CHECK(to_host(y)[0] == 9.0f);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
  for (float* p : {x, y, acc}) REQUIRE(cudaFree(p) == cudaSuccess);
  REQUIRE(cudaEventDestroy(fork) == cudaSuccess);
  REQUIRE(cudaEventDestroy(join) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
}

TEST_CASE("graphs: a fork must be joined back and the capture ended where it began", "[emulator][graphs]") {
  cudaStream_t s = new_stream(), side = new_stream();
  cudaEvent_t fork = nullptr, join = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  float* x = dalloc();
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);
  MTNLG_LAUNCH(4, 256, 0, side, fill_kernel)(x, kN, 1.0f);
  cudaGraph_t g = reinterpret_cast<cudaGraph_t>(0x1);
  SECTION("ended on the stream that joined: unmatched, the capture goes on") {
    CHECK(cudaStreamEndCapture(side, &g) == cudaErrorStreamCaptureUnmatched);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnmatched);
    REQUIRE(cudaEventRecord(join, side) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s, join, 0) == cudaSuccess);
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(g != nullptr);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
  }
  SECTION("the branch's last op not waited for: unjoined work, no graph") {
    REQUIRE(cudaEventRecord(join, side) == cudaSuccess);
    MTNLG_LAUNCH(4, 256, 0, side, fill_kernel)(x, kN, 2.0f);  // after the join point
    REQUIRE(cudaStreamWaitEvent(s, join, 0) == cudaSuccess);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureUnjoined);
    CHECK(g == nullptr);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnjoined);
  }
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
  REQUIRE(cudaStreamIsCapturing(side, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusNone);
  REQUIRE(cudaFree(x) == cudaSuccess);
  REQUIRE(cudaEventDestroy(fork) == cudaSuccess);
  REQUIRE(cudaEventDestroy(join) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
}

TEST_CASE("graphs: the refusal's message is the runtime's and names what was refused", "[emulator][graphs]") {
  CHECK(std::string(cudaGetErrorName(cudaErrorStreamCaptureUnsupported)) == "cudaErrorStreamCaptureUnsupported");
  CHECK(std::string(cudaGetErrorString(cudaErrorStreamCaptureInvalidated)) ==
        "operation failed due to a previous error during capture");
  cudaStream_t s = new_stream();
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 64) == cudaErrorStreamCaptureUnsupported);
  const std::string msg = cudaGetErrorString(cudaErrorStreamCaptureUnsupported);
  CHECK(msg.rfind("operation not permitted when stream is capturing: cudaMalloc(64 bytes)", 0) == 0);
  CHECK(msg.find("is invalidated") != std::string::npos);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  CHECK(std::string(cudaGetErrorString(cudaErrorStreamCaptureInvalidated)).find("cudaMalloc(64 bytes)") !=
        std::string::npos);
  (void)cudaGetLastError();
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("graphs: capture modes decide who may call cudaMalloc", "[emulator][graphs]") {
  float* x = dalloc();
  cudaStream_t s = new_stream();
  SECTION("relaxed: cudaMalloc is allowed, and the new buffer can be captured") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    float* y = dalloc();
    MTNLG_LAUNCH(4, 256, 0, s, fill_kernel)(y, kN, 6.0f);
    cudaGraph_t g = nullptr;
    REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(to_host(y)[3] == 6.0f);
    REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
    REQUIRE(cudaFree(y) == cudaSuccess);
  }
  SECTION("relaxed: cudaFree is still refused (it synchronises the device)") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    float* y = dalloc();
    CHECK(cudaFree(y) == cudaErrorStreamCaptureUnsupported);
    expect_invalidated_end(s, x);
    REQUIRE(cudaFree(y) == cudaSuccess);
  }
  SECTION("global: another thread's cudaMalloc is refused; thread-local: it is allowed") {
    for (const bool global : {true, false}) {
      REQUIRE(cudaStreamBeginCapture(s, global ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal) ==
              cudaSuccess);
      cudaError_t got = cudaSuccess;
      void* p = nullptr;
      std::thread([&] { got = cudaMalloc(&p, 64); }).join();
      if (global) {
        CHECK(got == cudaErrorStreamCaptureUnsupported);
        expect_invalidated_end(s, x);
      } else {
        CHECK(got == cudaSuccess);
        cudaGraph_t g = nullptr;
        REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
        REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
        REQUIRE(cudaFree(p) == cudaSuccess);
      }
    }
  }
  SECTION("a thread in relaxed mode (cudaThreadExchangeStreamCaptureMode) may call cudaMalloc") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(mode == cudaStreamCaptureModeGlobal);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 64) == cudaSuccess);
    REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    cudaGraph_t g = nullptr;
    REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
    REQUIRE(cudaFree(p) == cudaSuccess);
  }
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaFree(x) == cudaSuccess);
}

TEST_CASE("graphs: where a capture may begin and end", "[emulator][graphs]") {
  float* x = dalloc();
  cudaStream_t s = new_stream();
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorIllegalState);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  cudaError_t other_thread = cudaSuccess;
  std::thread([&] {
    cudaGraph_t g2 = nullptr;
    other_thread = cudaStreamEndCapture(s, &g2);
  }).join();
  CHECK(other_thread == cudaErrorStreamCaptureWrongThread);
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);  // an empty graph
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaGraphInstantiate(&exec, g, cudaGraphInstantiateFlagUpload) == cudaErrorInvalidValue);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
  (void)cudaGetLastError();
  SECTION("a blocking stream's capture forbids the legacy stream, without invalidating on a status query") {
    cudaStream_t b = new_stream(cudaStreamDefault);
    REQUIRE(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CHECK(cudaStreamIsCapturing(nullptr, &st) == cudaErrorStreamCaptureImplicit);
    REQUIRE(cudaStreamIsCapturing(b, &st) == cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusActive);
    // In relaxed mode cudaMemcpy is no unsafe call, but it uses the legacy stream.
    std::vector<float> h(kN);
    CHECK(cudaMemcpy(h.data(), x, kBytes, cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureImplicit);
    expect_invalidated_end(b, x);
    REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
  }
  SECTION("a kernel launched on the legacy stream while a blocking stream captures is refused") {
    cudaStream_t b = new_stream(cudaStreamDefault);
    REQUIRE(cudaStreamBeginCapture(b, cudaStreamCaptureModeGlobal) == cudaSuccess);
    MTNLG_LAUNCH(4, 256, 0, nullptr, fill_kernel)(x, kN, 2.0f);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureImplicit);
    expect_invalidated_end(b, x);
    REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
  }
  SECTION("a non-blocking stream's capture leaves the legacy stream alone in relaxed mode") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    MTNLG_LAUNCH(4, 256, 0, nullptr, fill_kernel)(x, kN, 2.0f);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    CHECK(to_host(x)[1] == 2.0f);  // cudaMemcpy allowed: relaxed, and no blocking stream captures
    REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
  }
  SECTION("an event recorded in an ended capture marks no stream's work") {
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreate(&e) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaErrorInvalidValue);
    CHECK(cudaEventSynchronize(e) == cudaErrorInvalidValue);
    REQUIRE(cudaEventRecord(e, s) == cudaSuccess);  // an ordinary record makes it usable again
    CHECK(cudaEventSynchronize(e) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
    REQUIRE(cudaEventDestroy(e) == cudaSuccess);
    (void)cudaGetLastError();
  }
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaFree(x) == cudaSuccess);
}
