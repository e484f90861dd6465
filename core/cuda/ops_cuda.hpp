// The CUDA backend of the op set: Tensor-level entry points that core/ops/<family>.cpp calls
// when its arguments live on Device::cuda (same names and argument meanings as
// core/ops.hpp), and the kernels' limits and switches. The kernels themselves and their
// raw launchers live in core/cuda/<family>.cu, each file ending with its family's entries.
//
// Dtypes on CUDA (checked here, RuntimeError naming the op and the argument):
//   activations, their gradients and the weights as used by the forward: f32, bf16 or
//     f16, all the same within one call;
//   parameter gradients (matmul dw/dbias, layernorm/rmsnorm/qk_norm dw/db, bias_add db, embedding
//     dtable, position dpos): f32 (fp32 gradient accumulation);
//   statistics (layernorm mean/rstd, rmsnorm and qk_norm rstd, attention lse, xent rowmax/sumexp/target_logit/
//     dloss): f32;
//   optimizer param/grad/m/v: f32 (the master copy); f64 is CPU-only.
// In fp32 training all of these are f32, so the model's CPU allocations carry over.
// Attention comes in both forms: probs (unfused: batched GEMMs + softmax kernel, any head
// size) and lse (flash: cuDNN's fused attention, bf16/fp16, head sizes that are multiples
// of 8 up to 128; core/cuda/cudnn_attention.hpp).
#pragma once
#include <cstdint>
#include <vector>

#include "core/op_params.hpp"
#include "core/ops.hpp"
#include "core/tensor.hpp"

namespace mtnlg::cuda {

// Every op of core/ops.hpp with a CUDA implementation, declared from its one declaration
// there (same name, same parameters; the defaults stay on the ops:: side, whose
// dispatchers pass every argument). Adding an op: its declaration in core/ops.hpp, its
// CPU file, its CUDA file, and its name on this list.
#define MTNLG_CUDA_OP(name) decltype(::mtnlg::ops::name) name;
MTNLG_CUDA_OP(fill)
MTNLG_CUDA_OP(copy)
MTNLG_CUDA_OP(add)
MTNLG_CUDA_OP(scale)
MTNLG_CUDA_OP(swap_axes)
MTNLG_CUDA_OP(sum_squares)  // synchronises (the sum comes back to the host)
MTNLG_CUDA_OP(sum_squares_accumulate)
MTNLG_CUDA_OP(xent_loss_accumulate)
MTNLG_CUDA_OP(all_finite)  // synchronises
MTNLG_CUDA_OP(convert)
MTNLG_CUDA_OP(matmul_forward)
MTNLG_CUDA_OP(matmul_backward)
MTNLG_CUDA_OP(matmul_bias_gelu_forward)
MTNLG_CUDA_OP(matmul_dgelu_backward)
MTNLG_CUDA_OP(layernorm_forward)
MTNLG_CUDA_OP(residual_layernorm_forward)
MTNLG_CUDA_OP(residual_add_forward)
MTNLG_CUDA_OP(layernorm_backward)
MTNLG_CUDA_OP(residual_layernorm_backward)
MTNLG_CUDA_OP(rmsnorm_forward)  // the LayerNorm's kernels without mean and bias
MTNLG_CUDA_OP(residual_rmsnorm_forward)
MTNLG_CUDA_OP(rmsnorm_backward)
MTNLG_CUDA_OP(residual_rmsnorm_backward)
MTNLG_CUDA_OP(swiglu_forward)
MTNLG_CUDA_OP(swiglu_backward)
MTNLG_CUDA_OP(rope_forward)
MTNLG_CUDA_OP(rope_backward)
MTNLG_CUDA_OP(qk_norm_forward)  // a warp per head
MTNLG_CUDA_OP(qk_norm_backward)
MTNLG_CUDA_OP(gelu_forward)
MTNLG_CUDA_OP(gelu_backward)
MTNLG_CUDA_OP(dropout_forward)
MTNLG_CUDA_OP(attention_forward)  // the probs form: batched GEMMs + a softmax kernel, any head size
MTNLG_CUDA_OP(attention_backward)
MTNLG_CUDA_OP(attention_forward_lse)  // the lse form: cuDNN fused attention (cudnn_attention.hpp)
MTNLG_CUDA_OP(attention_backward_lse)
MTNLG_CUDA_OP(attention_cached_forward)
MTNLG_CUDA_OP(attention_block_forward)  // context parallelism's pieces: the unfused form over a block
MTNLG_CUDA_OP(attention_block_backward)
MTNLG_CUDA_OP(attention_merge_forward)  // the log-sum-exp merge, one thread per row
MTNLG_CUDA_OP(attention_merge_backward)
MTNLG_CUDA_OP(attention_kv_forward)  // the K/V buffer of a cp exchange: a strided copy
MTNLG_CUDA_OP(attention_kv_backward)
MTNLG_CUDA_OP(embedding_forward)
MTNLG_CUDA_OP(embedding_backward)
MTNLG_CUDA_OP(position_forward)
MTNLG_CUDA_OP(position_backward)
MTNLG_CUDA_OP(bias_add_forward)
MTNLG_CUDA_OP(bias_add_backward)
MTNLG_CUDA_OP(xent_rowmax)
MTNLG_CUDA_OP(xent_sumexp_target)
MTNLG_CUDA_OP(xent_backward)
MTNLG_CUDA_OP(adamw_flat)  // one launch over the whole fp32 master; copy_out gets the bf16/f16 weights
#undef MTNLG_CUDA_OP

// ---- limits and switches of the kernels ---------------------------------------------
// Largest head size the KV-cache attention kernel takes.
constexpr int64_t kAttnMaxHeadDim = 256;
// Whether matmuls go through cuBLASLt (default true); off, every one takes the
// cublasGemmEx fallback. Returns the previous setting (tests run both paths).
bool set_gemm_lt(bool on);
// Whether the matmul forward fuses the bias into cuBLASLt's epilogue (default true);
// off, or when the heuristic offers no algorithm with the epilogue, the bias is added by
// a separate kernel after the GEMM. Returns the previous setting.
bool set_gemm_bias_epilogue(bool on);
// Whether matmul_bias_gelu_forward / matmul_dgelu_backward use cuBLASLt's GELU_AUX_BIAS
// and DGELU epilogues (then the bias-gradient kernel) for bf16/fp16 (default true); off,
// when refused, and always for f32 (core/cuda/gemm.cu says why), they run the GEMM and
// the separate GELU / bias-gradient kernels. Returns the previous setting.
bool set_gemm_gelu_epilogue(bool on);
// GEMMs that ran with a GELU epilogue (forward or backward) since start-up.
int64_t gemm_gelu_fused();
// Matmuls since start-up that did not run as asked: each call whose optional epilogue
// cuBLASLt refused (the GEMM and separate kernels ran instead; warned once per shape),
// and each matmul run by the cublasGemmEx fallback.
int64_t gemm_fallbacks();

}  // namespace mtnlg::cuda
