// Rotary position embedding on CUDA: the q and k heads of the packed qkv rotated in
// place (after a copy when out is another tensor). CPU reference: core/ops/rope.cpp,
// which states the formulas.
//
// Gradient contract: no parameters; dqkv is WRITTEN (the rotation by -angle).
// One block per qkv row (sample b, position t): each thread takes pairs i (strided by
// the block), computes inv_freq[i] in double as the CPU does (RopeParams::inv_freq),
// rounds it to fp32, then the fp32 angle (past + t) * inv_freq and its cosf/sinf once,
// and rotates pair i of every q and k head of the row.
#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

template <typename T>
__global__ void rope_kernel(T* x, int64_t Tn, int64_t G, int64_t Q, int64_t D, int64_t rot, ops::RopeParams p,
                            int64_t past, float sign) {
  const int64_t r = blockIdx.x, half = rot / 2, row = G * (Q + 2) * D;
  const float pos = static_cast<float>(past + r % Tn);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float a = pos * static_cast<float>(p.inv_freq(i, rot));
    const float c = cosf(a), s = sign * sinf(a);
    const int64_t ia = p.interleaved ? 2 * i : i, ib = p.interleaved ? 2 * i + 1 : i + half;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t blk = 0; blk <= Q; ++blk) {  // the group's query heads and its key
        T* h = x + r * row + (g * (Q + 2) + blk) * D;
        const float xa = to_f(h[ia]), xb = to_f(h[ib]);
        h[ia] = from_f<T>(xa * c - xb * s);
        h[ib] = from_f<T>(xb * c + xa * s);
      }
  }
}

}  // namespace

void rope(void* x, DType dt, int64_t B, int64_t Tn, int64_t G, int64_t Q, int64_t D, int64_t rot,
          const ops::RopeParams& p, int64_t past, float sign) {
  if (B * Tn <= 0) return;
  if (B * Tn > INT32_MAX) fail("rope: batch x positions exceeds the kernel's grid");
  const int threads = rot / 2 >= 128 ? 128 : static_cast<int>((rot / 2 + 31) / 32 * 32);
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(static_cast<unsigned>(B * Tn), threads, 0, stream(), rope_kernel<T>)(
                      static_cast<T*>(x), Tn, G, Q, D, rot, p, past, sign));
  MTNLG_CUDA_LAUNCH_CHECK("rope_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

namespace {
void rope_entry(const char* op, Tensor& out, const Tensor& in, int64_t heads, int64_t groups, const ops::RopeParams& p,
                int64_t past, float sign) {
  const DType dt = cuda_dtype(op, "qkv", in.dtype());
  const op_checks::QkvShape s = op_checks::qkv_shape(op, in, heads, groups);
  const int64_t rot = ops::rope_rot_dim(p, s.D);
  if (out.raw() != in.raw()) copy(out, in);
  k::rope(out.raw(), dt, s.B, s.T, s.G, s.per_group(), s.D, rot, p, past, sign);
}
}  // namespace

void rope_forward(Tensor& out, const Tensor& qkv, int64_t heads, int64_t groups, const ops::RopeParams& p,
                  int64_t past) {
  rope_entry("rope_forward", out, qkv, heads, groups, p, past, 1.0f);
}

void rope_backward(Tensor& dqkv, const Tensor& dout, int64_t heads, int64_t groups, const ops::RopeParams& p,
                   int64_t past) {
  rope_entry("rope_backward", dqkv, dout, heads, groups, p, past, -1.0f);
}

}  // namespace mtnlg::cuda
