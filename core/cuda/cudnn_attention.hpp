// The flash form of attention on CUDA: cuDNN's fused scaled-dot-product attention,
// forward and backward, causal, with dropout, bf16/fp16, through cuDNN's graph (backend)
// API (core/cuda/cudnn_attention.cu; the graphs are written out in docs/specs/cudnn-sdpa.md).
//
// cuDNN is loaded at run time (dlopen of libcudnn.so.9, else libcudnn_graph.so.9): a
// machine without it runs mtnlg unchanged, and model.attention_backend: auto then takes
// the unfused form. Under the emulated CUDA backend the same calls go to the emulated
// cuDNN (emulator/cudnn.cpp), which recognises these graphs and refuses others. Context
// parallelism's blocks (a split layout, unmasked or causal) are graphs of the same kind.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/ops.hpp"
#include "core/tensor.hpp"

namespace mtnlg::cuda {

// One attention graph mtnlg builds (docs/specs/cudnn-sdpa.md has them op by op): the
// direction, the problem (bf16/fp16, B samples, T positions, H heads of size D), the
// dropout probability and the backward's algorithm. G: the key/value heads (query groups
// of grouped-query attention, H % G == 0; 0 or H: one per query head). The graph's
// tensors are strided views of the packed per-group qkv rows [q_0 .. q_{H/G-1} | k | v]
// (docs/specs/cudnn-sdpa.md, "Grouped-query attention").
struct SdpaGraph {
  bool forward = true;
  DType dt = DType::bf16;
  int64_t B = 1, T = 1, H = 1, D = 64;
  int64_t G = 0;
  double dropout_p = 0;
  // Context parallelism's blocks (docs/specs/cudnn-sdpa.md, "Blocks"). `split`: Q (and
  // dQ) are views of qkv-shaped rows [B, q_rows, (H+2G)*D] (their q columns), K and V (dK,
  // dV) views of a separate K/V buffer [B, kv_rows, G*2*D] (per group [k | v]), each from
  // its own pointer; O, dO [B, q_rows, H*D] and the statistics [B, H, q_rows] are views
  // too, so a block may cover part of its buffers' rows (the pointers moved on). T query
  // positions against Tkv key/value positions (0: T), causal (T == Tkv) or without a mask.
  // Not split: the packed qkv views above, causal, Tkv = T. No dropout in a split graph.
  bool split = false;
  bool causal = true;
  int64_t Tkv = 0;
  int64_t q_rows = 0, kv_rows = 0;  // 0: T, Tkv
  // Backward only. false: cuDNN 9's default, dQ accumulated in an fp32 buffer by atomic
  // adds (fast, bitwise non-reproducible); true: the deterministic algorithm, dP kept in a
  // [B, H, T, T] workspace (training.deterministic_mode).
  bool deterministic = false;
  // A deliberate mistake built into the graph, for the tests that show cuDNN refuses
  // wrong graphs: the statistics as max - log(sum) (SUB for ADD), or P handed to the
  // second matmul in fp32 instead of the I/O type; or, in a grouped backward, dK and dV
  // written straight by the matmuls (no sum over the group's query heads).
  enum class Flaw { none, stats_sub_for_add, fp32_probs, grouped_unsummed };
  Flaw flaw = Flaw::none;
};

// Bytes of the fp32 dQ accumulator a backward call allocates beside the plan's workspace
// ([B, H, T, D] fp32; 0 for the forward and the deterministic backward).
int64_t dq_accumulator_bytes(const SdpaGraph& g);

// What a cuDNN library answers for one graph: an execution plan (with its workspace) or
// a refusal (with cuDNN's reason).
struct SdpaPlan {
  bool planned = false;
  int64_t workspace = 0;    // CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE of the plan
  int64_t accumulator = 0;  // dq_accumulator_bytes(graph), allocated by mtnlg per call
  std::string why;          // the refusal, when not planned
  int64_t device_bytes() const { return workspace + accumulator; }
};

// Plans `g`, built by the same builders the training calls use, without a GPU: cuDNN
// >= 9.8 finalizes heuristics and execution plans for the device that `device_json`
// describes (a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR's JSON: core/cuda/cudnn_device.hpp).
// `library`: "" the backend's cuDNN (the emulated one in an emulated build),
// "installed" libcudnn.so.9 as the dynamic loader finds it, else a file to dlopen. A
// library that does not load, or refuses, answers planned = false with the reason.
// cuDNN compiles its attention kernels at planning time through libcuda.so.1: without
// a driver, a stand-in must be loaded first (core/cuda/cudnn_device.hpp).
SdpaPlan plan_offline(const SdpaGraph& g, const std::string& device_json, const std::string& library = "");

// The backward's algorithm in this process's training calls: false (the default) cuDNN
// 9's, dQ accumulated in fp32 by atomic adds; true its deterministic algorithm. Set once
// at start-up from training.deterministic_mode (app/process/placement.hpp,
// configure_determinism), before the model plans anything: like Megatron's
// --deterministic-mode, a property of the process, not of one call.
void set_deterministic_attention(bool on);
bool deterministic_attention();

// The device-property JSON cuDNN serializes for this process's GPU `device` (on a GPU
// only): what the GPU proof saves so that the offline plan table plans for the real
// device instead of its data sheet (test/fixtures/cudnn/, docs/GPU.md). Refused when
// cuDNN does not load or cannot describe the device.
std::string device_json_of_gpu(int device);

// Whether cuDNN's fused attention runs this problem on this process's GPU: cuDNN loads,
// the dtype is bf16 or fp16, and cuDNN builds an execution plan for the forward and the
// backward graph of exactly this shape and dropout, with this process's backward
// algorithm (the plans are kept for the calls that follow). When not, `why` says what
// refused it.
bool fused_attention_supported(DType dt, int64_t B, int64_t T, int64_t H, int64_t D, double dropout_p, std::string* why,
                               int64_t groups = 0);

// out [B, T, H*D], lse [B, H, T] f32 (natural-log log-sum-exp of the scaled, masked
// scores: cuDNN's softmax statistics), from qkv [B, T, (H+2G)*D] (per group its H/G
// query heads, then its k and v; G = `groups`, 0 meaning H: Megatron's per-head q, k, v). dqkv is WRITTEN. The dropout mask is cuDNN's Philox stream for (drop.key,
// the rows' offset): not the CPU's mask bits (docs/specs/cudnn-sdpa.md). The backward's
// algorithm is deterministic_attention()'s. A plan cuDNN refuses throws Refused.
void cudnn_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads,
                             const ops::AttentionDropout& drop, int64_t groups = 0);
void cudnn_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              int64_t heads, const ops::AttentionDropout& drop, int64_t groups = 0);

// Context parallelism's p2p blocks in the split layout (docs/specs/cudnn-sdpa.md,
// "Blocks"): the query rows [blk.q_begin, +blk.q_count) of qkv [B, L, (H+2G)*D] (its q
// columns) against the key rows [blk.k_begin, +blk.k_count) of kv [B, Lk, G*2*D] (per
// group [k | v]), causal (a square block: the diagonal) or unmasked. The forward writes the
// block's rows of out [B, L, H*D] (the I/O dtype) and lse [B, H, L] (f32); the backward,
// from the WHOLE attention's out and lse (every block merged), writes the block's rows of
// the q columns of dq (qkv-shaped, the I/O dtype; its other columns and rows untouched)
// and of dkv (kv-shaped). No dropout, no causal offset (Refused). A plan cuDNN refuses
// throws Refused.
void cudnn_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t heads,
                         const ops::AttentionBlock& blk, int64_t groups = 0);
void cudnn_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                          const Tensor& out, const Tensor& lse, int64_t heads, const ops::AttentionBlock& blk,
                          int64_t groups = 0);
// The graphs of context parallelism's blocks over L = 2c local rows, forward and backward
// with this process's backward algorithm: gather_ranks 0, the p2p ring's three (the
// diagonal L x L causal, L x c and c x L unmasked, buffers of L rows); n, all_gather's over
// n ranks (a chunk's c x c causal diagonal and the unmasked c x kc prefixes, k = 1 ..
// 2n-1, against the gathered K/V of nL rows).
std::vector<SdpaGraph> cp_block_graphs(DType dt, int64_t B, int64_t L, int64_t H, int64_t D, int64_t groups,
                                       int64_t gather_ranks);
// Whether cuDNN plans every one of them; `why` says what refused it when not.
bool fused_cp_blocks_supported(DType dt, int64_t B, int64_t L, int64_t H, int64_t D, std::string* why,
                               int64_t groups = 0, int64_t gather_ranks = 0);

// "cuDNN 9.19.0 (libcudnn.so.9)" or why it did not load; `library` as for plan_offline.
std::string cudnn_description(const std::string& library = "");

}  // namespace mtnlg::cuda
