// Token embedding (vocab-parallel) and learned positions. CPU reference:
// core/ops/embedding.cpp.
//
// Gradient contract: dpos and dtable ACCUMULATE (+=, fp32); embedding_forward writes
// `out`, position_forward adds in place. Determinism without atomics: every output
// element of a backward is owned by one thread, which adds its inputs in row order, so
// position_backward and embedding_backward reproduce the CPU's fp32 bits exactly (same
// order, same starting value). embedding_backward with the host-built grouping of rows by
// token (ops::EmbeddingGradOrder) runs a block per (token, column tile): the same sums in
// the same order, with as many blocks as distinct tokens times column tiles instead of
// C / 256.
#include <climits>

#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void position_forward_kernel(T* x, const T* pos, int64_t rows, int64_t C, int64_t row_start,
                                        int64_t seq_len) {
  const int64_t n = rows * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i % C;
    x[i] = from_f<T>(to_f(x[i]) + to_f(pos[((row_start + r) % seq_len) * C + c]));
  }
}

template <typename T>
__global__ void position_backward_kernel(float* dpos, const T* dx, int64_t rows, int64_t C, int64_t row_start,
                                         int64_t seq_len) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t p = blockIdx.y; p < seq_len; p += gridDim.y) {
    int64_t r = ((p - row_start) % seq_len + seq_len) % seq_len;  // first row r with (row_start+r)%T == p
    if (r >= rows) continue;
    float acc = dpos[p * C + c];
    for (; r < rows; r += seq_len) acc += to_f(dx[r * C + c]);
    dpos[p * C + c] = acc;
  }
}

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tok, const T* table, int64_t N, int64_t C,
                                         int64_t vstart, int64_t vlocal) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i % C;
    const int64_t id = static_cast<int64_t>(tok[r]) - vstart;
    out[i] = (id >= 0 && id < vlocal) ? table[id * C + c] : from_f<T>(0.0f);
  }
}

template <typename T>
__global__ void embedding_backward_kernel(float* dtable, const int32_t* tok, const T* dout, int64_t N, int64_t C,
                                          int64_t vstart, int64_t vlocal) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t id = static_cast<int64_t>(tok[i]) - vstart;
    if (id >= 0 && id < vlocal) dtable[id * C + c] += to_f(dout[i * C + c]);
  }
}

// The same sums by token run: block x owns run x of the grouping (its rows in row order),
// block y a tile of columns; each thread one column of that token's row in dtable. The
// grid covers the most runs there can be; the run count is read on the device, so the
// launch does not depend on the batch (CUDA graphs replay it as captured).
template <typename T>
__global__ void embedding_backward_runs_kernel(float* dtable, const int32_t* tok, const int32_t* rows,
                                               const int32_t* starts, const int32_t* count, const T* dout, int64_t C,
                                               int64_t vstart, int64_t vlocal) {
  if (static_cast<int64_t>(blockIdx.x) >= static_cast<int64_t>(*count)) return;
  const int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  const int64_t b = starts[blockIdx.x], e = starts[blockIdx.x + 1];
  const int64_t id = static_cast<int64_t>(tok[rows[b]]) - vstart;
  if (c >= C || id < 0 || id >= vlocal) return;
  float acc = dtable[id * C + c];
  for (int64_t k = b; k < e; ++k) acc += to_f(dout[static_cast<int64_t>(rows[k]) * C + c]);
  dtable[id * C + c] = acc;
}

}  // namespace

void embedding_backward_runs(float* dtable, const int32_t* tok, const int32_t* rows, const int32_t* starts,
                             const int32_t* count, int64_t max_runs, const void* dout, DType dt, int64_t C,
                             int64_t vstart, int64_t vlocal) {
  if (max_runs <= 0 || C <= 0) return;
  if (max_runs > INT32_MAX || col_blocks(C, kThreads) > 65535) fail("embedding_backward: grid too large");
  const dim3 grid(static_cast<unsigned>(max_runs), col_blocks(C, kThreads));
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid, kThreads, 0, stream(), embedding_backward_runs_kernel<T>)(
                      dtable, tok, rows, starts, count, static_cast<const T*>(dout), C, vstart, vlocal));
  MTNLG_CUDA_LAUNCH_CHECK("embedding_backward_runs_kernel");
}

void position_forward(void* x, const void* pos, DType dt, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
  if (rows * C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(rows * C, kThreads), kThreads, 0, stream(), position_forward_kernel<T>)(
                      static_cast<T*>(x), static_cast<const T*>(pos), rows, C, row_start, seq_len));
  MTNLG_CUDA_LAUNCH_CHECK("position_forward_kernel");
}

void position_backward(float* dpos, const void* dx, DType dt, int64_t rows, int64_t C, int64_t row_start,
                       int64_t seq_len) {
  if (rows <= 0 || C <= 0) return;
  const dim3 grid(col_blocks(C, kThreads), static_cast<unsigned>(std::min<int64_t>(seq_len, 65535)));
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid, kThreads, 0, stream(), position_backward_kernel<T>)(
                      dpos, static_cast<const T*>(dx), rows, C, row_start, seq_len));
  MTNLG_CUDA_LAUNCH_CHECK("position_backward_kernel");
}

void embedding_forward(void* out, const int32_t* tok, const void* table, DType dt, int64_t N, int64_t C, int64_t vstart,
                       int64_t vlocal) {
  if (N * C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(N * C, kThreads), kThreads, 0, stream(), embedding_forward_kernel<T>)(
                      static_cast<T*>(out), tok, static_cast<const T*>(table), N, C, vstart, vlocal));
  MTNLG_CUDA_LAUNCH_CHECK("embedding_forward_kernel");
}

void embedding_backward(float* dtable, const int32_t* tok, const void* dout, DType dt, int64_t N, int64_t C,
                        int64_t vstart, int64_t vlocal) {
  if (N <= 0 || C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(col_blocks(C, kThreads), kThreads, 0, stream(), embedding_backward_kernel<T>)(
                      dtable, tok, static_cast<const T*>(dout), N, C, vstart, vlocal));
  MTNLG_CUDA_LAUNCH_CHECK("embedding_backward_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table, int64_t vocab_start) {
  const char* op = "embedding_forward";
  const DType dt = cuda_dtype(op, "out", out.dtype());
  const int64_t C = table.dim(1), N = tokens.numel();
  k::embedding_forward(out.raw(), ip(tokens), table.raw(), dt, N, C, vocab_start, table.dim(0));
}

void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                        const ops::EmbeddingGradOrder* order) {
  const char* op = "embedding_backward";
  const DType dt = cuda_dtype(op, "dout", dout.dtype());
  const int64_t C = dtable.dim(1), N = tokens.numel();
  if (order) {
    k::embedding_backward_runs(f(dtable), ip(tokens), ip(order->rows), ip(order->starts), ip(order->count),
                               order->max_runs, dout.raw(), dt, C, vocab_start, dtable.dim(0));
    return;
  }
  k::embedding_backward(f(dtable), ip(tokens), dout.raw(), dt, N, C, vocab_start, dtable.dim(0));
}

void position_forward(Tensor& x, const Tensor& pos, int64_t row_start, int64_t seq_len) {
  const char* op = "position_forward";
  const DType dt = cuda_dtype(op, "x", x.dtype());
  const int64_t C = pos.dim(1), rows = C ? x.numel() / C : 0;
  k::position_forward(x.raw(), pos.raw(), dt, rows, C, row_start, seq_len);
}

void position_backward(Tensor& dpos, const Tensor& dx, int64_t row_start, int64_t seq_len) {
  const char* op = "position_backward";
  const DType dt = cuda_dtype(op, "dx", dx.dtype());
  const int64_t C = dpos.dim(1), rows = C ? dx.numel() / C : 0;
  k::position_backward(f(dpos), dx.raw(), dt, rows, C, row_start, seq_len);
}

}  // namespace mtnlg::cuda
