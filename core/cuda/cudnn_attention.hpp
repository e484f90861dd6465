// The flash form of attention on CUDA: cuDNN's fused scaled-dot-product attention,
// forward and backward, causal, with dropout, bf16/fp16, through cuDNN's graph (backend)
// API (core/cuda/cudnn_attention.cu; the graphs are written out in docs/specs/cudnn-sdpa.md).
//
// cuDNN is loaded at run time (dlopen of libcudnn.so.9, else libcudnn_graph.so.9): a
// machine without it runs mtnlg unchanged, and model.attention_backend: auto then takes
// the unfused form. Under the emulated CUDA backend the same calls go to the emulated
// cuDNN (emulator/cudnn.cpp), which recognises these two graphs and refuses others.
#pragma once
#include <cstdint>
#include <string>

#include "core/ops.hpp"
#include "core/tensor.hpp"

namespace mtnlg::cuda {

// Whether cuDNN's fused attention runs this problem: cuDNN loads, the dtype is bf16 or
// fp16, the head size is a multiple of 8 and at most 128, and cuDNN builds an execution
// plan for the forward and the backward graph of exactly this shape and dropout (the
// plans are kept for the calls that follow). When not, `why` says what refused it.
bool fused_attention_supported(DType dt, int64_t B, int64_t T, int64_t H, int64_t D, double dropout_p,
                               std::string* why);

// out [B, T, H*D], lse [B, H, T] f32 (natural-log log-sum-exp of the scaled, masked
// scores: cuDNN's softmax statistics), from qkv [B, T, H*3*D] (Megatron's per-head
// q, k, v). dqkv is WRITTEN. The dropout mask is cuDNN's Philox stream for (drop.key,
// the rows' offset): not the CPU's mask bits (docs/specs/cudnn-sdpa.md).
void cudnn_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads,
                             const ops::AttentionDropout& drop);
void cudnn_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              int64_t heads, const ops::AttentionDropout& drop);

// "cuDNN 9.19.0 (libcudnn.so.9)" or why it did not load.
std::string cudnn_description();

}  // namespace mtnlg::cuda
