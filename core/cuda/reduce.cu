// Column reductions and gathers: bias_add_backward, position_forward's backward,
// embedding_forward/backward. CPU references: core/cpu/ops_cpu.cpp
// (bias_add_backward, position_backward, embedding_forward, embedding_backward).
//
// Gradient contract: db, dpos and dtable ACCUMULATE (+=, fp32); embedding_forward
// writes `out`. Determinism without atomics: every output element is owned by one
// thread, which adds its inputs in row order. position_backward and
// embedding_backward therefore reproduce the CPU's fp32 bits exactly (same order,
// same starting value); bias_add_backward sums fixed 256-row chunks first (the chunk
// count depends on N only), so it is run-to-run identical but rounds differently from
// the CPU.
#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowChunk = 256;

template <typename T>
__global__ void colsum_partial_kernel(float* partial, const T* x, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t chunk = blockIdx.y; chunk * kRowChunk < N; chunk += gridDim.y) {
    const int64_t r1 = (N < (chunk + 1) * kRowChunk ? N : (chunk + 1) * kRowChunk);
    float acc = 0;
    for (int64_t r = chunk * kRowChunk; r < r1; ++r) acc += to_f(x[r * C + c]);
    partial[chunk * C + c] = acc;
  }
}

__global__ void colsum_final_kernel(float* out, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float acc = 0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * C + c];
  out[c] += acc;
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
__global__ void embedding_forward_kernel(T* out, const int32_t* tok, const T* table, int64_t N, int64_t C, int64_t vstart,
                                         int64_t vlocal) {
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

unsigned col_blocks(int64_t C) { return static_cast<unsigned>((C + kThreads - 1) / kThreads); }

}  // namespace

void bias_add_backward(float* db, const void* dout, Dt dt, int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return;
  const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  DeviceBuffer<float> partial(chunks * C);
  const dim3 grid(col_blocks(C), static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  MTNLG_DT_SWITCH(dt, T,
                  colsum_partial_kernel<T><<<grid, kThreads, 0, stream()>>>(partial.data(), static_cast<const T*>(dout), N,
                                                                            C));
  MTNLG_CUDA_LAUNCH_CHECK("colsum_partial_kernel");
  colsum_final_kernel<<<col_blocks(C), kThreads, 0, stream()>>>(db, partial.data(), chunks, C);
  MTNLG_CUDA_LAUNCH_CHECK("colsum_final_kernel");
}

void position_backward(float* dpos, const void* dx, Dt dt, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
  if (rows <= 0 || C <= 0) return;
  const dim3 grid(col_blocks(C), static_cast<unsigned>(std::min<int64_t>(seq_len, 65535)));
  MTNLG_DT_SWITCH(dt, T,
                  position_backward_kernel<T><<<grid, kThreads, 0, stream()>>>(dpos, static_cast<const T*>(dx), rows, C,
                                                                               row_start, seq_len));
  MTNLG_CUDA_LAUNCH_CHECK("position_backward_kernel");
}

void embedding_forward(void* out, const int32_t* tok, const void* table, Dt dt, int64_t N, int64_t C, int64_t vstart,
                       int64_t vlocal) {
  if (N * C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  embedding_forward_kernel<T><<<grid_for(N * C, kThreads), kThreads, 0, stream()>>>(
                      static_cast<T*>(out), tok, static_cast<const T*>(table), N, C, vstart, vlocal));
  MTNLG_CUDA_LAUNCH_CHECK("embedding_forward_kernel");
}

void embedding_backward(float* dtable, const int32_t* tok, const void* dout, Dt dt, int64_t N, int64_t C, int64_t vstart,
                        int64_t vlocal) {
  if (N <= 0 || C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  embedding_backward_kernel<T><<<col_blocks(C), kThreads, 0, stream()>>>(
                      dtable, tok, static_cast<const T*>(dout), N, C, vstart, vlocal));
  MTNLG_CUDA_LAUNCH_CHECK("embedding_backward_kernel");
}

}  // namespace mtnlg::cuda::k
