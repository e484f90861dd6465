// The parts a decoder layer is built from where the two families differ (model/gpt.hpp):
// each is chosen once, from GptConfig, when the chunk is built, and the layer code calls
// it without asking which form it is. A new block type goes here: a struct with the
// forward and backward of its form(s), the ops it calls (core/ops.hpp) with their CPU
// references and CUDA kernels, and its parameters declared in declare_chunk_params.
#pragma once
#include <cstdint>

#include "core/ops.hpp"
#include "core/tensor.hpp"

namespace mtnlg::model {

// The norm before each sublayer and at the end of the stack: LayerNorm (statistics mean
// and rstd, weight and bias) or RMSNorm (rstd and weight; `mean` and `b` stay undefined).
// The residual forms fuse the residual add that feeds the norm (and its backward).
struct Norm {
  bool rms = false;
  double eps = 1e-5;

  // Allocates the statistics of `rows` rows (mean only for LayerNorm).
  void stats(Tensor& mean, Tensor& rstd, int64_t rows, DType wide, Device dev) const;
  void forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b) const;
  // sum = x + dropout(branch + br.bias), out = norm(sum).
  void residual_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& branch,
                        const ops::ResidualBranch& br, const Tensor& w, const Tensor& b) const;
  // dx = (accumulate ? += : =) norm'(dout); dw +=, db += (LayerNorm).
  void backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x, const Tensor& w,
                const Tensor& mean, const Tensor& rstd) const;
  // dx = dresidual + norm'(dout) (may alias dresidual).
  void residual_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dresidual, const Tensor& dout,
                         const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) const;
};

// The MLP's first half and its activation: GELU(x W1^T + b1) (GPT), or SwiGLU:
// silu(x Wg^T) * (x Wu^T) with W1 = [Wg; Wu] read as one weight of 2F rows (this rank's
// halves, side by side in the store). `pre` is fc1's output, what the backward needs.
struct Mlp {
  bool swiglu = false;

  int64_t pre_width(int64_t ffn_local) const { return swiglu ? 2 * ffn_local : ffn_local; }
  // act [N, F] = activation(pre), pre [N, pre_width] = in @ w1^T (+ b1).
  void forward(Tensor& act, Tensor& pre, const Tensor& in, const Tensor& w1, const Tensor* b1) const;
  // dpre (written) from fc2's output gradient dout [N, C] through fc2's input (w2 [C, F])
  // and the activation; db1 += its column sums when fc1 has a bias.
  void backward(Tensor& dpre, Tensor* db1, const Tensor& dout, const Tensor& w2, const Tensor& pre) const;
};

// Qwen3's per-head query/key RMSNorm (ops::qk_norm_forward) on the packed qkv after its
// projection and before the rotary embedding, or nothing. Weights wq, wk [D].
struct QkNorm {
  bool on = false;
  double eps = 1e-6;

  // qkv [B, T, (H + 2G) D] := its q and k heads normed. keep (training): `pre` takes the
  // input and rstd [B * T * G * (H/G + 1)] the statistics, for the backward; otherwise in place.
  void forward(Tensor& qkv, Tensor& pre, Tensor& rstd, const Tensor& wq, const Tensor& wk, int64_t heads,
               int64_t groups, bool keep, DType wide) const;
  // dqkv := the gradient before the norms (in place); dwq +=, dwk +=.
  void backward(Tensor& dqkv, Tensor& dwq, Tensor& dwk, const Tensor& pre, const Tensor& rstd, const Tensor& wq,
                const Tensor& wk, int64_t heads, int64_t groups) const;
};

// Where positions enter the attention: rotary embedding of q and k (in place on the packed
// qkv, after its projection) or nothing (learned positions are added at the embedding).
struct Rotary {
  bool on = false;
  ops::RopeParams params;

  // qkv [B, T, (H + 2G) D]: rotates q and k of positions past + t.
  void forward(Tensor& qkv, int64_t heads, int64_t groups, int64_t past) const;
  // dqkv := the gradient before the rotation (in place).
  void backward(Tensor& dqkv, int64_t heads, int64_t groups, int64_t past) const;
};

}  // namespace mtnlg::model
