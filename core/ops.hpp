// The op set. Each family is a forward/backward pair with explicit buffers (no autograd),
// dispatched on the device (the CPU implementation in core/ops/<family>.cpp, the CUDA one
// in core/cuda/<family>.cu) and the dtype (f32, bf16, f16 for training, f64 for
// finite-difference checks). Argument structs: core/op_params.hpp.
//
// Dtype roles (core/ops/common.hpp): the activations and forward weights of one call
// share one dtype (f32, bf16, f16; f64 for finite-difference tests); statistics (mean,
// rstd, lse, row max, sum of exp, target logit, dloss) and parameter gradients are f32
// (f64 with f64 activations). bf16/f16 run with fp32 arithmetic and round-to-nearest-even
// stores on both backends, so the CPU is the reference of the GPU's mixed precision.
//
// Gradient contract: parameter gradients ACCUMULATE (+=) so
// micro-batches add up; activation gradients are WRITTEN (=) unless an argument says
// `accumulate`. Shapes: N = rows (batch*sequence), C = channels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/op_params.hpp"
#include "core/tensor.hpp"

namespace mtnlg::ops {

// ---- elementwise / utility ----------------------------------------------------------
void fill(Tensor& x, double value);
void copy(Tensor& dst, const Tensor& src);                // same numel, any shapes
void add(Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (out may alias a or b)
void add_inplace(Tensor& acc, const Tensor& x);           // acc += x
void scale(Tensor& x, double s);                          // x *= s
// out [P, b, a, inner] = in [P, a, b, inner] (its axes a and b swapped; inner = the
// numel / (P a b)): a copy in any dtype, the same bits on every device. Its adjoint is
// swap_axes(dout, din, P, b, a). Context parallelism's a2a moves heads with it.
void swap_axes(Tensor& out, const Tensor& in, int64_t P, int64_t a, int64_t b);
double sum_squares(const Tensor& x);  // sum of x^2 in double
bool all_finite(const Tensor& x);
// Converts between floating dtypes (f32 <-> f64 <-> bf16 <-> f16), same numel.
void convert(Tensor& dst, const Tensor& src);

// ---- matmul (OpenBLAS on CPU, cuBLASLt on CUDA) ---------------------------------------
// out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias[OC])
void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias);
// dinp[N,C] (= or += with accumulate_dinp), dw[OC,C] +=, dbias[OC] += ; any of the
// outputs may be null to skip it.
void matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                     bool accumulate_dinp = false);
// The MLP's first half fused: pre = inp @ w^T + bias, out = gelu(pre); both are written
// (pre is what the backward needs). On CUDA one cuBLASLt GEMM with the GELU_AUX_BIAS
// epilogue when offered, else the GEMM then the GELU kernel; on the CPU the two ops.
void matmul_bias_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& w, const Tensor& bias);
// Its backward through the following linear layer's input: with that layer's weight w
// [OC, C], dout [N, OC] and pre [N, C], dpre = (dout @ w) * gelu'(pre) (written) and
// dbias += the column sums of dpre (the bias of the GELU's input layer; fp32 gradients
// accumulate). On CUDA one GEMM with the DGELU_BGRAD epilogue when offered; on the CPU
// matmul_backward, gelu_backward and bias_add_backward.
void matmul_dgelu_backward(Tensor& dpre, Tensor& dbias, const Tensor& dout, const Tensor& w, const Tensor& pre);

// ---- layernorm -------------------------------------------------------------------------
// out[N,C] = (inp - mean)*rstd*w + b; saves mean[N], rstd[N] for backward.
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b,
                       double eps);
// A residual branch joining the stream and the LayerNorm that reads the stream, in one
// pass over each row:
//   sum = x + dropout(branch + br.bias)   (stored in the activation dtype: the next residual)
//   out = layernorm(sum; w, b), mean/rstd saved
// with the same roundings as bias_add_forward(), dropout_forward(), add() and
// layernorm_forward() one after the other (each intermediate rounded to the activation
// dtype), so the results are those of the four ops bit for bit, on the CPU and on CUDA
// (one kernel there). sum may alias x.
void residual_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                                const Tensor& branch, const ResidualBranch& br, const Tensor& w, const Tensor& b,
                                double eps);
// The same without a LayerNorm after it: sum = x + dropout(branch + br.bias), one pass.
void residual_add_forward(Tensor& sum, const Tensor& x, const Tensor& branch, const ResidualBranch& br);
// residual_layernorm_forward without bias and dropout: sum = a + b, out = layernorm(sum).
void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, double eps);
// dinp = (accumulate? +=: =), dw +=, db +=
void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp = false);
// The backward of a LayerNorm on the residual stream: the stream's gradient is the
// residual's plus the LayerNorm's, dinp = dresidual + layernorm'(dout) (written; may
// alias dresidual), dw +=, db +=. The same bits as copy(dinp, dresidual) then
// layernorm_backward(..., accumulate_dinp = true), without the copy.
void residual_layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dresidual, const Tensor& dout,
                                 const Tensor& inp, const Tensor& w, const Tensor& mean, const Tensor& rstd);

// ---- RMSNorm (the Llama family's normalisation; core/ops/layernorm.cpp, the LayerNorm's
// kernels without the mean and the bias) ---------------------------------------------------
// out[N,C] = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps); saves rstd[N] (wide) for
// backward. No bias.
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& w, double eps);
// residual_layernorm_forward with an RMSNorm: sum = x + dropout(branch + br.bias) (stored in
// the activation dtype), out = rmsnorm(sum; w), rstd saved; the same bits as the unfused
// ops (bias_add_forward, dropout_forward, add, rmsnorm_forward) one after the other, on
// the CPU and on CUDA. sum may alias x.
void residual_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& branch,
                              const ResidualBranch& br, const Tensor& w, double eps);
// dinp = (accumulate? +=: =), dw +=
void rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dout, const Tensor& inp, const Tensor& w,
                      const Tensor& rstd, bool accumulate_dinp = false);
// dinp = dresidual + rmsnorm'(dout) (written; may alias dresidual), dw +=: the same bits as
// copy(dinp, dresidual) then rmsnorm_backward(..., accumulate_dinp = true).
void residual_rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dresidual, const Tensor& dout, const Tensor& inp,
                               const Tensor& w, const Tensor& rstd);

// ---- SwiGLU (core/ops/swiglu.cpp): inp[N, 2F] = [gate | up] per row, out[N, F] =
// silu(gate) * up; dinp = d[gate | up] (written) ---------------------------------------------
void swiglu_forward(Tensor& out, const Tensor& inp);
void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp);

// ---- rotary position embedding (core/ops/rope.cpp) ----------------------------------------
// Rotates the q and k heads of the attention's packed qkv [B, T, G*(H/G+2)*D] (the layout
// of attention_forward below; v passes through): position past + t of each sample, the
// first rot_dim = D * p.percent dims of each head in pairs by angle position * inv_freq[i]
// (rope_inv_freq), rotate-half or interleaved pairing (RopeParams). cos/sin in fp32 (fp64
// for f64 tensors). out may alias qkv (then only the rotated dims are written).
void rope_forward(Tensor& out, const Tensor& qkv, int64_t heads, int64_t groups, const RopeParams& p, int64_t past);
// The backward is the rotation by -angle of dq and dk (dv passes through): dqkv = (written;
// may alias dout).
void rope_backward(Tensor& dqkv, const Tensor& dout, int64_t heads, int64_t groups, const RopeParams& p, int64_t past);
// rot_dim of a head of `head_dim` (head_dim * p.percent, which must be a positive even
// integer: RuntimeError otherwise).
int64_t rope_rot_dim(const RopeParams& p, int64_t head_dim);
// The rot_dim / 2 inverse frequencies inv_freq[i] = base^(-2i / rot_dim), with Llama 3.1's
// scaling applied when p.scaling (RopeParams::inv_freq): what the kernels use, for the model
// and the tests.
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t rot_dim);

// ---- per-head query/key RMSNorm (core/ops/qk_norm.cpp; Qwen3's q_norm / k_norm) ---------------
// On the attention's packed qkv [B, T, G*(H/G+2)*D] (attention_forward's layout), before the
// rotary embedding: each query head vector is replaced by rmsnorm(q_h) * wq and each key
// head by rmsnorm(k_g) * wk (wq, wk [D], shared by all query / key heads; eps inside the
// square root as rmsnorm_forward's); the values pass through. rstd [B, T, G*(H/G+1)]
// (wide) is saved per normalised head in the row's order (a group's query heads, then its
// key). out may alias qkv (in place; the backward then needs a copy of the input).
void qk_norm_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& wq, const Tensor& wk, int64_t heads,
                     int64_t groups, double eps);
// From the forward's input qkv and rstd: dqkv = the gradient before the norms (written; may
// alias dout; dv passes through), dwq +=, dwk += (wide).
void qk_norm_backward(Tensor& dqkv, Tensor& dwq, Tensor& dwk, const Tensor& dout, const Tensor& qkv, const Tensor& wq,
                      const Tensor& wk, const Tensor& rstd, int64_t heads, int64_t groups);

// ---- GELU (tanh approximation, as GPT-2 and Megatron) ------------------------------
void gelu_forward(Tensor& out, const Tensor& inp);
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);  // dinp =

// ---- dropout (counter-based: element e of the mask is a pure function of key and
// base_index + e, identical on CPU and CUDA and under any parallel layout). On CUDA a set
// `dkey` gives the key and base_index from device memory instead (core/rng.hpp) ---------
void dropout_forward(Tensor& out, const Tensor& inp, double p, uint64_t key, uint64_t base_index,
                     const DeviceKey& dkey = {});
void dropout_backward(Tensor& dinp, const Tensor& dout, double p, uint64_t key, uint64_t base_index,
                      const DeviceKey& dkey = {});  // dinp =

// ---- causal self-attention -------------------------------------------------------------
// qkv[B,T,G*(H/G+2)*D] with `groups` G key/value heads (grouped-query attention; H % G ==
// 0; groups 0 means G = H), laid out per group as [q_0 .. q_{H/G-1} | k | v] (Megatron's
// layout, so that a column-parallel shard is a contiguous block of whole groups); G == H
// is per head [q | k | v]. Query head h attends with its group's k and v, g = h / (H/G).
// out[B,T,H*D]; probs[B,H,T,T] saved (softmax before dropout) for backward. The unfused
// form of model.attention_backend: on CUDA batched cuBLASLt GEMMs around a softmax kernel
// (core/cuda/attention.cu), on the CPU the row kernel below.
void attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t heads, const AttentionDropout& drop,
                       int64_t groups = 0);
// dqkv = ; uses probs from forward. A group's dk and dv are the sums over its query heads.
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        const AttentionDropout& drop, int64_t groups = 0);

// Log-sum-exp variant (core/ops/attention.cpp): saves lse[B,H,T] = log sum_{j<=i}
// exp(q_i.k_j/sqrt(D)) per row instead of probs[B,H,T,T], so activation memory is O(T)
// instead of O(T^2) per head; the backward recomputes the probabilities from qkv and
// lse and also needs the forward's `out`: the flash form of model.attention_backend (on
// CUDA a fused kernel, lse must be f32 there; on the CPU the same row kernel as above).
// Same dropout mask as attention_forward. dqkv = .
// Whether the lse form runs this problem on `device`: always on the CPU and the test
// device; on CUDA when cuDNN's fused attention takes it (bf16/fp16, head size a multiple
// of 8 up to 128, cuDNN loaded and planning this shape: core/cuda/cudnn_attention.hpp).
// When it does not, `why` says what refused it; when it does, `why` names the engine.
// Grouped-query attention (groups != heads) too: cuDNN's graph then has fewer key/value
// heads than query heads (docs/specs/cudnn-sdpa.md).
bool attention_lse_supported(Device device, DType dt, int64_t B, int64_t T, int64_t heads, int64_t head_dim,
                             double dropout_p, std::string* why, int64_t groups = 0);
void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const AttentionDropout& drop,
                           int64_t groups = 0);
void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const AttentionDropout& drop, int64_t groups = 0);
// ---- context-parallel attention's pieces (core/ops/attention.cpp, core/cuda/attention.cu:
// the unfused form over the block; activations f32, bf16 or f16 (f64 on the CPU), the lse
// wide; parallel/context_parallel.hpp composes them across ranks; formulas in
// docs/specs/context-parallel.md) ---------------------------------------------------------
// One block: the query rows blk.q_* of qkv [B, Tq, G*(H/G+2)*D] (only the q columns are
// read) against the key/value rows blk.k_* of kv [B, Tk, G*2*D] (per group [k | v], the
// groups' K/V only). out [B, Tq, H*D] and lse [B, H, Tq] (wide) are written for EVERY row:
// a row outside the query range or seeing no key gets out 0 and lse -inf, which the merge
// below treats as "no keys". Attention dropout (blk.drop) draws the one-rank op's mask at
// the rows' global positions (blk.q_rows, blk.kv_rows, blk.seq_len); lse is before dropout.
void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t heads,
                             const AttentionBlock& blk, int64_t groups = 0);
// Its backward over the block's rows with out and lse those of the WHOLE attention (every
// block merged; a row's probabilities are exp(s_ij - lse_i), D_i = dout_i . out_i - dlse_i):
// the q columns of dqkv += dq (its other columns are not touched), dkv += dk, dv. With the
// block's own out and lse and dlse it is the exact gradient of attention_block_forward
// (finite differences in the op table); dlse may be null (0).
void attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor* dlse, const Tensor& qkv,
                              const Tensor& kv, const Tensor& out, const Tensor& lse, int64_t heads,
                              const AttentionBlock& blk, int64_t groups = 0);
// Attention over two disjoint key sets from each one's output (activation dtype) and
// log-sum-exp (wide), computed in the wide dtype: lse = log(exp(lse_a) + exp(lse_b)), out = exp(lse_a - lse) out_a + exp(lse_b - lse)
// out_b, per (sample, head, row); a row with both lse -inf gets out 0, lse -inf. out [B, T,
// H*D], lse [B, H, T]; out/lse may alias out_a/lse_a (merging in place). out and out_a may
// be f32 with out_b bf16/f16 (a block of cuDNN's fused form merged into a wide accumulator:
// out_b read widened).
void attention_merge_forward(Tensor& out, Tensor& lse, const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b);
// Its gradient (all written): with w_x = exp(lse_x - lse), dout_x = w_x dout and dlse_x =
// w_x (dout . (out_x - out) + dlse); dlse may be null (0).
void attention_merge_backward(Tensor& dout_a, Tensor& dlse_a, Tensor& dout_b, Tensor& dlse_b, const Tensor& dout,
                              const Tensor* dlse, const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b);

// The p2p ring's blocks in cuDNN's fused form (CUDA, bf16/fp16, no dropout;
// core/cuda/cudnn_attention.hpp, docs/specs/cudnn-sdpa.md "Blocks"): the query rows
// blk.q_* of qkv [B, L, G*(H/G+2)*D] against the key rows blk.k_* of kv [B, Lk, G*2*D],
// causal (the square diagonal) or unmasked. Unlike attention_block_forward only the
// block's rows are WRITTEN: out's (the activation dtype) and lse's (f32); the backward,
// from the whole attention's out and lse, WRITES the block's rows of the q columns of
// dqkv and of dkv (the rest untouched). Whether cuDNN plans the blocks of L = 2c local rows
// (gather_ranks 0: the p2p ring's diagonal, L x c, c x L; n: all_gather's over n ranks, a
// chunk's c x c diagonal and its prefixes): attention_cp_blocks_fused_supported, false off
// CUDA (`why` says).
bool attention_cp_blocks_fused_supported(Device device, DType dt, int64_t B, int64_t L, int64_t heads, int64_t head_dim,
                                         std::string* why, int64_t groups = 0, int64_t gather_ranks = 0);
void attention_block_fused_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t heads,
                                   const AttentionBlock& blk, int64_t groups = 0);
void attention_block_fused_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                    const Tensor& out, const Tensor& lse, int64_t heads, const AttentionBlock& blk,
                                    int64_t groups = 0);

// The K/V buffer of a context-parallel exchange (parallel/context_parallel.cpp): kv [B, T,
// G*2*D] = the k and v columns of every group of qkv [B, T, G*(H/G+2)*D], per group [k | v]
// (written). Its backward writes dkv into the k and v columns of dqkv (the q columns are
// not touched). Any activation dtype: a copy, the same bits on every device.
void attention_kv_forward(Tensor& kv, const Tensor& qkv, int64_t heads, int64_t groups = 0);
void attention_kv_backward(Tensor& dqkv, const Tensor& dkv, int64_t heads, int64_t groups = 0);

// Forward only, over a key/value cache (generation: prefill a prompt, then one token per
// step). k_cache/v_cache [B, G, capacity, D] (one per query group) in the activation dtype
// hold positions [0, past); the op writes the keys/values of the new positions
// [past, past + T) from qkv[B, T, G*(H/G+2)*D] into them, then query past + i attends to positions [0, past + i]
// (causal within the new block). out[B, T, H*D] is written. No dropout, no backward:
// with past = 0 it equals attention_forward_lse's output (test/core/ops/test_attention_lse.cpp).
void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past, int64_t groups = 0);

// ---- embeddings (vocab-parallel: this rank holds rows [vocab_start, vocab_start+V_local)) --
// out[N,C] = table[tok - vocab_start] for ids in range, 0 otherwise.
void embedding_forward(Tensor& out, const Tensor& tokens /* i32 [N] */, const Tensor& table, int64_t vocab_start);
// dtable += dout rows for ids in range, each element adding its rows in row order (so
// every device and `order` give the same bits). `order` (optional): the rows grouped by
// token, from embedding_grad_order on the same ids and placed beside them; on CUDA it
// lets a block own each (token, column tile) instead of one thread per column walking
// every row; the CPU does not need it.
void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                        const EmbeddingGradOrder* order = nullptr);
// The grouping of n token ids for embedding_backward, as one host i32 buffer of 2n + 2
// (see EmbeddingGradOrder for its layout) to upload with the ids.
Tensor embedding_grad_order(const int32_t* tokens, int64_t n);
// Rows of x are tokens in (sample, position) order; x holds global rows
// [row_start, row_start+rows) of a micro batch whose sequences have seq_len tokens.
// x[r,:] += pos[(row_start+r) % seq_len, :] ; dpos[...] += dx[r,:] (ordered by row).
void position_forward(Tensor& x, const Tensor& pos, int64_t row_start, int64_t seq_len);
void position_backward(Tensor& dpos, const Tensor& dx, int64_t row_start, int64_t seq_len);
// x[N,C] += b[C] ; db[C] += sum over rows of dout[N,C]
void bias_add_forward(Tensor& x, const Tensor& b);
void bias_add_backward(Tensor& db, const Tensor& dout);

// ---- vocab-parallel softmax cross-entropy (three stages around the TP reductions) -----
// logits[N,V_local]; columns >= valid_local are vocabulary padding and never count.
// 1) rowmax[N] = max over valid local columns (-inf if none)
void xent_rowmax(Tensor& rowmax, const Tensor& logits, int64_t valid_local);
// 2) given the global rowmax: sumexp[N] = sum exp(l - max), target_logit[N] = l[target] if
//    the target falls in [vocab_start, vocab_start+valid_local) else 0.
void xent_sumexp_target(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                        const Tensor& rowmax, int64_t vocab_start, int64_t valid_local);
// 3) dlogits = (softmax - onehot) * dloss[N]  (written, padding columns 0). May alias logits.
void xent_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& rowmax,
                   const Tensor& sumexp, const Tensor& dloss, int64_t vocab_start, int64_t valid_local);

// ---- step statistics: f64 accumulators that stay on the tensors' device ------------
// A training step reduces its loss and gradient norm into a small f64 tensor on the
// model's device and reads it once (one host round trip per step). Both sums are taken
// in double in a fixed order, so they do not depend on thread or block counts.
// acc[0] += sum of x^2 (x f32/f64/bf16/f16).
void sum_squares_accumulate(Tensor& acc, const Tensor& x);
// Token losses from the cross-entropy statistics, l_i = log(sumexp_i) + rowmax_i -
// target_logit_i, with optional weights mask[N] (f32, 1 = counts):
// acc[0] += sum_i mask_i * l_i, acc[1] += sum_i mask_i (the micro batch's sum is formed
// first, then added).
void xent_loss_accumulate(Tensor& acc, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit,
                          const Tensor* mask);

// ---- optimizer -------------------------------------------------------------------------
// Decoupled weight decay (AdamW): p -= lr * (mhat/(sqrt(vhat)+eps) + wd * p).
// param (the fp32 master weights), grad, m, v fp32 [n] (f64 too on the CPU).
// `copy_out` (optional, [n], bf16/f16, or the master itself): the compute copy of the
// weights, written with the update.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                Tensor* copy_out = nullptr);

// adamw_step over the segments of flat buffers in one call (one kernel launch on CUDA):
// p.weight_decay applies to the segments with weight_decay, 0 to the others; elements
// outside every segment are not touched. Segments are sorted by offset, do not overlap
// and lie inside [0, param.numel()) (RuntimeError otherwise).
void adamw_flat(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                const std::vector<AdamWSegment>& segments, Tensor* copy_out = nullptr);

}  // namespace mtnlg::ops
