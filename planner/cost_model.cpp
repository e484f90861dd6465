// Cost model: GPU table, layout checks, FLOPs, per-stage memory and time, communication
// bytes, and the run (batch ramp) total. Every constant is explained in docs/PLANNER.md;
// the comments here say what each term stands for.
#include "planner/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "model/flops.hpp"
#include "model/gpt.hpp"
#include "schedules/batch_schedule.hpp"
#include "schedules/pipeline_schedule.hpp"

namespace mtnlg::cost {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kCublasWorkspace =
    32.0 * 1024 * 1024;  // the cuBLASLt workspace mtnlg allocates (core/cuda/device.cpp)

// The GPU table (docs/PLANNER.md "Hardware" gives the source of each number).
const std::vector<GpuSpec>& gpu_table() {
  // Fields: name, description, peak, gemm_eff_max, SMs, memory, HBM, NVLink bus, IB per GPU,
  // NVLink alpha, IB alpha, kernel overhead, compute slots, gemm_k_half, fused attention
  // forward / backward FLOP/s (head dim 128, long sequences), attn_seq_half, attn_dim_half,
  // the data sheet's HBM bandwidth (hbm_peak_bw).
  static const std::vector<GpuSpec> table = {
      {"a100-80g", "NVIDIA A100 SXM 80GB, NVLink3 (DGX A100: 8x HDR 200 Gb/s HCAs)", 312e12, 0.78, 108, 80.0 * kGiB,
       0.85 * 2.039e12, 230e9, 23e9, 5e-6, 10e-6, 4e-6, 0, 64, 0.60 * 312e12, 0.50 * 312e12, 410, 124, 2.039e12},
      {"h100-80g", "NVIDIA H100 SXM 80GB, NVLink4 (DGX H100: 8x NDR 400 Gb/s HCAs)", 989e12, 0.875, 132, 79.6 * kGiB,
       0.85 * 3.35e12, 378e9, 46e9, 4e-6, 8e-6, 3e-6, 0, 512, 570e12, 550e12, 410, 124, 3.35e12},
      {"h200-141g", "NVIDIA H200 SXM 141GB, NVLink4 (8x NDR 400 Gb/s HCAs)", 989e12, 0.875, 132, 140.4 * kGiB,
       0.85 * 4.8e12, 378e9, 46e9, 4e-6, 8e-6, 3e-6, 0, 512, 570e12, 550e12, 410, 124, 4.8e12},
      // A starting point for `plan --calibrate` on CPU runs (fp32 OpenBLAS, MPI over shared
      // memory); its numbers only set the ratios the fit starts from, see docs/PLANNER.md.
      {"cpu", "this machine's CPU cores (fp32 OpenBLAS, MPI in shared memory): calibrate before use", 2e11, 1.0, 1,
       16.0 * kGiB, 10e9, 5e9, 1e9, 5e-6, 20e-6, 2e-6},
  };
  return table;
}

// Software profiles (docs/PLANNER.md "Software profiles" gives the evidence for each).
const std::vector<SoftwareProfile>& software_table() {
  static const std::vector<SoftwareProfile> table = {
      {"megatron-lm",
       "Megatron-LM 2022 (Korthikanti et al. 2022): fused kernels, batched p2p with scatter/gather, interleaved 1F1B, "
       "selective recompute, sequence parallelism, tensor-parallel gradient communication beside the GEMMs",
       1.0, true, 2, 4, true, false, false, false, false, false, false, 40e6, false, 12, 12,
       /*async_tp_grad_comm=*/true},
      {"megatron-lm-2021",
       "Megatron-LM 2021 (Narayanan et al. 2021): as megatron-lm with the 2021 kernel stack, every tensor-parallel "
       "collective synchronous",
       0.98, true, 2, 2},
      {"megatron-deepspeed",
       "Megatron-DeepSpeed as used for MT-NLG 530B (Smith et al. 2022): Megatron tensor slicing, DeepSpeed pipeline "
       "engine (blocking unbatched p2p of tensor-partitioned messages, no interleaving), 2021 kernel stack, every "
       "tensor-parallel collective synchronous",
       0.75, true, 4, 4, false},
      {"mtnlg",
       "this trainer (mtnlg train): megatron-lm's execution model, activations as model/gpt.cpp keeps them "
       "(flash-style attention, the exact schedule's in-flight microbatches), the head's backward in the forward",
       1.0, true, 2, 4, true, true, true, true, false, false, false, 40e6, false, 12, 12, false,
       /*head_backward_in_forward=*/true},
      {"megatron-core",
       "Megatron-Core 0.8+ (2024-25) with Transformer Engine: fused (cuDNN/flash) attention, tensor-parallel "
       "communication overlapped with the GEMMs (--tp-comm-overlap), gradient reduce-scatter and parameter "
       "all-gather overlapped with the backward / forward (--overlap-grad-reduce, --overlap-param-gather), "
       "pipeline p2p overlapped (interleaved)",
       0.65, true, 2, 4, true, false, false, false, true, true, true, 40e6, true, 38, 14},
  };
  return table;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Achieved FLOP/s of one GEMM C[M,N] += A[M,K] B[K,N] (batch independent products).
// Model: best large-GEMM efficiency x wave quantization of the best output tile over
// the SMs x a K-pipeline fill factor K/(K+64), bounded by the HBM roofline.
double gemm_time(const GpuSpec& g, double peak, int64_t M, int64_t N, int64_t K, int64_t batch = 1) {
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0) return 0;
  const double flops = 2.0 * double(M) * double(N) * double(K) * double(batch);
  // cuBLAS picks the output tile per shape; smaller tiles fill the last wave better but
  // reuse less data (relative throughput of 256x128, 128x256, 128x128 and 128x64 tiles:
  // 1, 1, 0.92, 0.80 -- the usual CUTLASS profile on A100/H100).
  struct Tile {
    int64_t m, n;
    double eff;
  };
  static constexpr Tile kTiles[] = {{256, 128, 1.0}, {128, 256, 1.0}, {128, 128, 0.92}, {128, 64, 0.80}};
  double wave_eff = 0;
  for (const Tile& tl : kTiles) {
    const int64_t tiles = ceil_div(M, tl.m) * ceil_div(N, tl.n) * batch;
    const int64_t waves = ceil_div(tiles, g.sm_count);
    wave_eff = std::max(wave_eff, tl.eff * double(tiles) / double(waves * g.sm_count));
  }
  const double k_eff = double(K) / (double(K) + g.gemm_k_half);
  const double t_compute = flops / (peak * g.gemm_eff_max * wave_eff * k_eff);
  const double bytes = 2.0 * (double(M) * K + double(K) * N + double(M) * N) * double(batch);
  const double t_memory = bytes / g.hbm_bw;
  return std::max(t_compute, t_memory) + g.kernel_overhead;
}

// Fused attention kernel (Transformer Engine -> cuDNN / FlashAttention): Q K^T and P V over
// the causal half of the s x s scores, at the kernel's measured rate for this sequence length
// and head dimension; the backward's five products (the scores recomputed) are 2.5x the
// forward's. Never faster than the best GEMM.
double fused_attention_time(const GpuSpec& g, double peak, int64_t s, int64_t dh, int64_t batch_heads, bool backward) {
  const double rate = backward ? g.attn_bwd_flops : g.attn_fwd_flops;
  if (!(rate > 0) || s <= 0 || dh <= 0 || batch_heads <= 0) return 0;
  const double work = 4.0 * double(s) * double(s) * double(dh) * double(batch_heads) * 0.5 * (backward ? 2.5 : 1.0);
  const double ramp = double(s) / (double(s) + g.attn_seq_half);
  const double dim = (double(dh) / (double(dh) + g.attn_dim_half)) / (128.0 / (128.0 + g.attn_dim_half));
  return work / std::min(peak * g.gemm_eff_max, rate * ramp * dim) + g.kernel_overhead;
}

struct GroupLink {
  double bw = 0, alpha = 0;
};

// A group of `size` ranks whose members are `stride` ranks apart stays inside one node
// when its span fits (ranks are placed node by node).
// A group that spans nodes runs its ring through every member of a node before crossing to
// the next; NCCL gives each of the node's HCAs its own ring (channel), so the ring's bus
// bandwidth is the node's members' HCAs together (ib_bw per member), at most NVLink's.
GroupLink group_link(const Cluster& c, int64_t stride, int64_t size) {
  if (stride * size <= c.gpus_per_node) return {c.gpu.nvlink_bus_bw, c.gpu.nvlink_alpha};
  const int64_t per_node = std::max<int64_t>(1, std::min(size, c.gpus_per_node / std::max<int64_t>(1, stride)));
  return {std::min(c.gpu.nvlink_bus_bw, c.gpu.ib_bw * double(per_node)), c.gpu.ib_alpha};
}

// How much slower each process computes because the node's processes share its compute
// (GpuSpec::compute_slots; 1 on GPUs). A single process is the reference: it runs at the
// profile's rates whatever the slots.
double compute_share(const Cluster& c, const Layout& l) {
  if (!(c.gpu.compute_slots > 0)) return 1.0;
  const int64_t per_node = std::min<int64_t>(l.gpus(), std::max<int64_t>(1, c.gpus_per_node));
  if (per_node <= 1) return 1.0;
  return std::max(1.0, double(per_node) / c.gpu.compute_slots);
}

// The GPU as the software stack drives it: the GEMM efficiency scaled by the profile.
Cluster effective(const Cluster& c) {
  Cluster e = c;
  e.gpu.gemm_eff_max = c.gpu.gemm_eff_max * c.software.kernel_efficiency;
  return e;
}

double allreduce_time(double bytes, int64_t n, GroupLink k) {
  if (n <= 1 || bytes <= 0) return 0;
  return 2.0 * double(n - 1) / double(n) * bytes / k.bw + 2.0 * double(n - 1) * k.alpha;
}
// A few bytes (a loss, a norm, a flag): NCCL's tree and MPI's recursive doubling take
// about 2 log2(n) latency steps instead of the ring's 2 (n - 1).
double small_allreduce_time(double bytes, int64_t n, GroupLink k) {
  if (n <= 1 || bytes <= 0) return 0;
  const double tree = 2.0 * std::ceil(std::log2(double(n))) * k.alpha + 2.0 * bytes / k.bw;
  return std::min(tree, allreduce_time(bytes, n, k));
}
double reduce_scatter_time(double bytes, int64_t n, GroupLink k) {
  if (n <= 1 || bytes <= 0) return 0;
  return double(n - 1) / double(n) * bytes / k.bw + double(n - 1) * k.alpha;
}

int64_t element_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }

// The model's shape as the cost model counts it. The GPT (h = a D, one key/value head per
// query head, GELU MLP, LayerNorm, biases, learned positions, tied output) and the Llama
// family (grouped-query attention with G groups of head size D, SwiGLU with gate and up
// each f wide, RMSNorm, no linear biases, rotary positions, untied output) differ only in
// these fields; every formula below reads them.
struct Shape {
  // s: the tokens of a sequence one rank holds (seq_length / cp); s_kv: the keys a query
  // reaches (the whole sequence: under context parallelism the rest arrive from the group)
  int64_t l, h, a, s, f, V, maxpos;
  int64_t s_kv = 0;
  int64_t G = 0, D = 0;  // key/value groups, head size
  bool swiglu = false;   // fc1 is gate and up: 2f wide
  bool rms = false;      // RMSNorm: a weight and rstd, no bias and no mean
  bool bias = true;      // add_bias_linear
  bool qkv_bias = true;  // add_bias_linear or add_qkv_bias
  bool untied = false;   // an output layer of its own on the last stage
  bool rope = false;     // no position table (rotary positions in every layer)
  bool qk_norm = false;  // qk_layernorm: two replicated [D] weights per layer, the qkv kept before them
  // mtnlg's trainer runs the unfused attention form (model.attention_backend): the
  // [b, a/t, s, s] probabilities exist and are kept unless selective recompute redoes them.
  bool unfused = false;
  // Mixture of experts (model.num_experts > 0): layer i routes when moe[i]; E experts of
  // width Fm, top k; a shared expert of width S (and its gate); the router's expert bias;
  // the balancing loss's scores and counts kept (aux), one group per sequence (seq_aux).
  int64_t E = 0, k = 0, Fm = 0, S = 0;
  bool s_gate = false, e_bias = false, aux = false, seq_aux = false, router64 = false;
  std::vector<bool> moe{};
  bool is_moe(int64_t i) const { return E > 0 && moe[static_cast<size_t>(i)]; }
  int64_t moe_pre() const { return swiglu ? 2 * Fm : Fm; }  // an expert's fc1 output width
  int64_t s_pre() const { return swiglu ? 2 * S : S; }
  int64_t qkv() const { return (a + 2 * G) * D; }      // q, k and v columns
  int64_t att() const { return a * D; }                // attention output width (the projection's input)
  int64_t pre() const { return swiglu ? 2 * f : f; }   // fc1's output width
  int64_t norm_params() const { return rms ? 1 : 2; }  // vectors of h per norm; also its fp32 statistics per row
};
Shape shape_of(const Recipe& r, int64_t tp, int64_t cp = 1) {
  const auto& m = r.model;
  Shape sh{m.num_layers,
           m.hidden_size,
           m.num_attention_heads,
           m.seq_length / cp,
           m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size,
           m.padded_vocab_size(tp),
           m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length};
  sh.s_kv = m.seq_length;
  sh.G = m.query_groups();
  sh.D = m.head_dim();
  sh.swiglu = m.swiglu;
  sh.rms = m.rmsnorm();
  sh.bias = m.add_bias_linear;
  sh.qkv_bias = m.qkv_bias();
  sh.untied = m.untie_embeddings_and_output_weights;
  sh.rope = m.rope();
  sh.qk_norm = m.qk_layernorm;
  const MoeConfig& e = m.moe;
  if (e.enabled()) {
    sh.E = e.num_experts;
    sh.k = e.moe_router_topk;
    sh.Fm = e.moe_ffn_hidden_size > 0 ? e.moe_ffn_hidden_size : sh.f;
    sh.S = e.moe_shared_expert_intermediate_size;
    sh.s_gate = e.moe_shared_expert_gate && sh.S > 0;
    sh.e_bias = e.moe_router_enable_expert_bias;
    sh.aux = e.moe_router_load_balancing_type != MoeLoadBalancing::none && e.moe_aux_loss_coeff > 0;
    sh.seq_aux = e.moe_router_load_balancing_type == MoeLoadBalancing::seq_aux_loss;
    sh.router64 = e.moe_router_dtype == MoeRouterDtype::fp64;
    for (int64_t i = 0; i < m.num_layers; ++i) sh.moe.push_back(e.is_moe_layer(i));
  }
  return sh;
}

// The layers (indices in the whole model) of model chunk `chunk` of pipeline stage `st`:
// consecutive stages without interleaving; with it, chunk c of stage st holds the c-th
// round's layers of that stage (model::partition_chunks).
std::vector<int64_t> chunk_layers(const Layout& l, int64_t st, int64_t chunk) {
  std::vector<int64_t> ids;
  if (l.vp == 1) {
    int64_t first = 0;
    for (int64_t i = 0; i < st; ++i) first += l.stage_layers[static_cast<size_t>(i)];
    for (int64_t i = 0; i < l.stage_layers[static_cast<size_t>(st)]; ++i) ids.push_back(first + i);
    return ids;
  }
  const int64_t per = l.stage_layers[static_cast<size_t>(st)] / l.vp;
  for (int64_t i = 0; i < per; ++i) ids.push_back((chunk * l.pp + st) * per + i);
  return ids;
}
int64_t moe_layers_of(const Shape& sh, const std::vector<int64_t>& ids) {
  int64_t n = 0;
  for (int64_t i : ids) n += sh.is_moe(i) ? 1 : 0;
  return n;
}
int64_t stage_moe_layers(const Shape& sh, const Layout& l, int64_t st) {
  int64_t n = 0;
  for (int64_t c = 0; c < l.vp; ++c) n += moe_layers_of(sh, chunk_layers(l, st, c));
  return n;
}

// Parameters one GPU holds for one transformer layer: the column/row-parallel weights
// and their sharded biases divided by tp, the norms (qk_layernorm's two of the head size
// too) and the two row-parallel output biases replicated (model/gpt.cpp
// declare_chunk_params).
double layer_params_per_gpu(const Shape& sh, int64_t tp) {
  const double h = double(sh.h), f = double(sh.f), qkv = double(sh.qkv()), pre = double(sh.pre());
  const double sharded =
      qkv * h + double(sh.att()) * h + pre * h + f * h + (sh.qkv_bias ? qkv : 0.0) + (sh.bias ? pre : 0.0);
  return sharded / double(tp) + double(2 * sh.norm_params() + (sh.bias ? 2 : 0)) * h +
         (sh.qk_norm ? 2.0 * double(sh.D) : 0.0);
}

// An MoE layer's routed experts on one GPU: the E / ep experts of this expert-parallel
// rank (fc1 pre_m x h, fc2 h x Fm; split further over etp).
double moe_layer_expert_params_per_gpu(const Shape& sh, const Layout& l) {
  return double(sh.E / l.ep) * (double(sh.moe_pre()) + double(sh.Fm)) * double(sh.h) / double(l.etp);
}

// An MoE layer's parameters on one GPU: the dense layer's less its MLP, then the router
// [E, h] (and its bias [E]) replicated, the routed experts above, the shared expert (and
// its gate [1, h]) whole on every tp rank, as the trainer holds it (each tp rank applies
// it to its own sequence-parallel rows). MoE layers have no linear biases (the trainer
// refuses them).
double moe_layer_params_per_gpu(const Shape& sh, const Layout& l) {
  const double h = double(sh.h);
  const double mlp = (double(sh.pre()) + double(sh.f)) * h / double(l.tp);
  const double shared = (double(sh.s_pre()) + double(sh.S)) * h + (sh.s_gate ? h : 0.0);
  return layer_params_per_gpu(sh, l.tp) - mlp + double(sh.E) * h + (sh.e_bias ? double(sh.E) : 0.0) +
         moe_layer_expert_params_per_gpu(sh, l) + shared;
}

// The routed experts' part of stage_params_per_gpu: reduced and ZeRO-1 sharded over their
// own replicas (Layout::expert_replicas), not dp x cp.
double stage_expert_params_per_gpu(const Shape& sh, const Layout& l, int64_t st) {
  return double(stage_moe_layers(sh, l, st)) * moe_layer_expert_params_per_gpu(sh, l);
}

// Parameters pipeline stage `st` holds on one tensor rank: its layers; the word embedding
// and (learned positions) the position table on the first stage; the final norm on the
// last, with the output layer (untied) or the tied embedding's copy (pp > 1).
double stage_params_per_gpu(const Shape& sh, const Layout& l, int64_t st) {
  const double t = double(l.tp);
  const int64_t layers = l.stage_layers[static_cast<size_t>(st)], moe = stage_moe_layers(sh, l, st);
  double params = double(layers - moe) * layer_params_per_gpu(sh, l.tp);
  if (moe > 0) params += double(moe) * moe_layer_params_per_gpu(sh, l);
  if (st == 0) params += double(sh.V) * double(sh.h) / t + (sh.rope ? 0.0 : double(sh.maxpos) * double(sh.h));
  if (st == l.pp - 1) {
    params += double(sh.norm_params()) * double(sh.h);
    if (sh.untied || l.pp > 1) params += double(sh.V) * double(sh.h) / t;
  }
  return params;
}

std::vector<int64_t> even_split(int64_t layers, int64_t pp) {
  std::vector<int64_t> v(static_cast<size_t>(pp), layers / pp);
  for (int64_t i = 0; i < layers % pp; ++i) v[static_cast<size_t>(i)] += 1;
  return v;
}

// Time pieces of one transformer layer for one microbatch on one GPU.
struct LayerTime {
  double fwd = 0;        // forward compute incl. forward TP communication
  double bwd = 0;        // backward (no recompute)
  double attn_core = 0;  // forward of the attention core (what selective recompute redoes)
  double tp_fwd = 0;     // forward TP communication
  double tp_bwd = 0;
  double cp_fwd = 0;  // exposed context-parallel communication of the attention, forward
  double cp_bwd = 0;
  double ep_fwd = 0;  // an MoE layer's token all-to-alls (dispatch and combine), forward
  double ep_bwd = 0;
};

// One layer's GEMM times that tensor-parallel communication can hide under.
struct TpGemms {
  double f_qkv, f_proj, f_fc1, f_fc2;  // forward
  double d_qkv, d_proj, d_fc1, d_fc2;  // data gradients
  double w_qkv, w_fc1;                 // weight gradients of the column-parallel layers
};

// Tensor-parallel communication of one layer into r.tp_fwd / r.tp_bwd: 2 all-reduces
// forward and 2 backward of b*s*h elements (`bytes`; SP: all-gather + reduce-scatter
// pairs with the same ring volume), less what the software overlaps with the GEMMs.
void layer_tp_comm(LayerTime& r, const Layout& l, const Cluster& c, double bytes, const TpGemms& g) {
  const int64_t t = l.tp;
  const GroupLink k = group_link(c, 1, t);
  if (l.sequence_parallel && c.software.tp_comm_overlap) {
    // --tp-comm-overlap: each all-gather / reduce-scatter (one of them C seconds alone) is
    // split into t chunks pipelined with the GEMM that consumes or produces it; the GEMM's
    // first chunk (1/t of it) cannot hide communication, the other (t-1)/t can.
    const double C = reduce_scatter_time(bytes, t, k);
    const double cover = double(t - 1) / double(t);
    auto exposed = [&](double gemm) { return std::max(0.0, C - cover * gemm); };
    // Forward: all-gather before QKV and fc1, reduce-scatter after the projection and fc2.
    r.tp_fwd = exposed(g.f_qkv) + exposed(g.f_proj) + exposed(g.f_fc1) + exposed(g.f_fc2);
    // Backward: all-gather of the output gradient under the projection's and fc2's data
    // gradients; re-gather of the LayerNorm outputs (only the 1/t shard is kept) under the
    // QKV and fc1 data gradients, and the reduce-scatter of their input gradients under
    // their weight gradients.
    r.tp_bwd = exposed(g.d_proj) + exposed(g.d_fc2) + exposed(g.d_qkv) + exposed(g.d_fc1) + exposed(g.w_qkv) +
               exposed(g.w_fc1);
    return;
  }
  const double tp_one = allreduce_time(bytes, t, k);
  r.tp_fwd = 2 * tp_one;
  r.tp_bwd = 2 * tp_one;
  if (c.software.async_tp_grad_comm) {
    // Backward of the column-parallel QKV and fc1 (SoftwareProfile::async_tp_grad_comm).
    auto beside = [](double comm, double gemm) { return std::max(0.0, comm - gemm); };
    if (l.sequence_parallel) {
      const double C = reduce_scatter_time(bytes, t, k);  // one all-gather or reduce-scatter
      r.tp_bwd = 2 * C + beside(C, g.d_qkv) + beside(C, g.d_fc1) + beside(C, g.w_qkv) + beside(C, g.w_fc1);
    } else {
      r.tp_bwd = beside(tp_one, g.w_qkv) + beside(tp_one, g.w_fc1);
    }
  }
}

// Bytes an element of context parallelism's dK/dV travels in: the trainer sums a K/V
// block's gradient in f32 whatever the activations' dtype (parallel/context_parallel.cpp).
constexpr double kCpGradBytes = 4;

// Context-parallel communication of one layer's attention into r.cp_fwd / r.cp_bwd
// (CommBytes::cp for the volumes), `att_f` / `att_b` this rank's attention core forward and
// backward. p2p passes each K/V block beside the computation of the block before it: each
// step is exposed by what one block's compute (1 / cp of the core) cannot cover, at least
// its latency. all_gather and a2a are collectives before and after the core, exposed whole.
void layer_cp_comm(LayerTime& r, const Shape& sh, const Layout& l, const Cluster& c, double e, double att_f,
                   double att_b) {
  const int64_t n = l.cp;
  if (n < 2) return;
  const GroupLink k = group_link(c, l.tp, n);
  const double t = double(l.tp), rows = double(l.micro_batch) * double(sh.s), cpd = double(n);
  const double kv = rows * 2.0 * double(sh.G * sh.D) / t * e;  // this rank's K and V
  const double dkv = kv * kCpGradBytes / e;                    // their gradient, summed in f32
  switch (l.cp_comm) {
    case CpCommType::p2p: {
      // Backward: cp - 1 steps each moving a K/V block and a dK/dV buffer beside a block's
      // compute, then the buffer's way home with nothing left to hide it.
      auto step = [&](double bytes, double cover) { return std::max(k.alpha, k.alpha + bytes / k.bw - cover); };
      r.cp_fwd = (cpd - 1) * step(kv, att_f / cpd);
      r.cp_bwd = (cpd - 1) * step(kv + dkv, att_b / cpd) + step(dkv, 0);
      return;
    }
    case CpCommType::all_gather:
      r.cp_fwd = reduce_scatter_time(cpd * kv, n, k);
      r.cp_bwd = reduce_scatter_time(cpd * kv, n, k) + reduce_scatter_time(cpd * dkv, n, k);
      return;
    case CpCommType::a2a:
    case CpCommType::a2a_p2p: {
      // a2a+p2p: the heads' all-to-all inside groups of m consecutive cp ranks (a2a's
      // exchange at m), then p2p's ring across the cp / m groups (the same K/V bytes a
      // rank: m times the rows, 1 / m of the heads); plain a2a is m = cp.
      const int64_t m = l.cp_comm == CpCommType::a2a ? n : l.cp_a2a, ring = n / m;
      const GroupLink ka = group_link(c, l.tp, m), kr = group_link(c, l.tp * m, ring);
      const double md = double(m), ringd = double(ring);
      auto a2a = [&](double bytes) { return m > 1 ? (md - 1) / md * bytes / ka.bw + (md - 1) * ka.alpha : 0.0; };
      auto step = [&](double bytes, double cover) { return std::max(kr.alpha, kr.alpha + bytes / kr.bw - cover); };
      const double qkv = rows * double(sh.qkv()) / t * e, out = rows * double(sh.att()) / t * e;
      const double lse = rows * double(sh.a) / t * 4.0;
      r.cp_fwd = a2a(qkv) + a2a(out) + (ring > 1 ? (ringd - 1) * step(kv, att_f / ringd) : 0.0);
      r.cp_bwd = a2a(qkv) + 2 * a2a(out) + a2a(lse) + a2a(qkv) +
                 (ring > 1 ? (ringd - 1) * step(kv + dkv, att_b / ringd) + step(dkv, 0) : 0.0);
      return;
    }
  }
}

LayerTime layer_time(const Shape& sh, const Layout& l, const Cluster& c, Precision prec) {
  const GpuSpec& g = c.gpu;
  const double peak = prec == Precision::fp32 ? g.peak_flops * 0.5 : g.peak_flops;  // fp32 runs use TF32
  const double e = double(element_bytes(prec));
  const int64_t t = l.tp, b = l.micro_batch, s = sh.s, h = sh.h;
  const int64_t T = b * s, dh = sh.D, heads = sh.a / t;
  const int64_t qkv = sh.qkv() / t, att = sh.att() / t, pre = sh.pre() / t, ffn = sh.f / t;
  LayerTime r;
  // Linear layers: QKV (column; (a + 2G) D wide), projection (row; from a D), fc1 (column;
  // gate and up together under SwiGLU), fc2 (row).
  const double f_qkv = gemm_time(g, peak, T, qkv, h), f_proj = gemm_time(g, peak, T, h, att),
               f_fc1 = gemm_time(g, peak, T, pre, h), f_fc2 = gemm_time(g, peak, T, h, ffn);
  const double lin_f = f_qkv + f_proj + f_fc1 + f_fc2;
  // Backward: data gradient (same shape as forward with N and K swapped) and weight gradient (K = tokens).
  const double d_qkv = gemm_time(g, peak, T, h, qkv), d_proj = gemm_time(g, peak, T, att, h),
               d_fc1 = gemm_time(g, peak, T, h, pre), d_fc2 = gemm_time(g, peak, T, ffn, h);
  const double w_qkv = gemm_time(g, peak, h, qkv, T), w_proj = gemm_time(g, peak, att, h, T),
               w_fc1 = gemm_time(g, peak, h, pre, T), w_fc2 = gemm_time(g, peak, ffn, h, T);
  const double lin_b = d_qkv + d_proj + d_fc1 + d_fc2 + w_qkv + w_proj + w_fc1 + w_fc2;
  const bool flash = c.software.trainer_activations ? !sh.unfused : c.software.flash_attention;
  const bool fused = c.software.fused_attention && g.attn_fwd_flops > 0 && g.attn_bwd_flops > 0;
  double att_f = 0, att_b = 0;
  // Under context parallelism this rank's s queries reach the whole sequence's s_kv keys,
  // and the fused kernel's causal work is shared evenly by the cp ranks (the load-balanced
  // split).
  const int64_t skv = sh.s_kv > 0 ? sh.s_kv : s;
  if (fused) {
    att_f = fused_attention_time(g, peak, skv, dh, b * heads, false) / double(l.cp);
    att_b = fused_attention_time(g, peak, skv, dh, b * heads, true) / double(l.cp);
  } else {
    // Attention core: scores = Q K^T and context = P V, batched over b * heads.
    att_f = gemm_time(g, peak, s, skv, dh, b * heads) + gemm_time(g, peak, s, dh, skv, b * heads);
    // Flash-style: the backward also recomputes the scores Q K^T (half the forward's GEMMs).
    att_b = flash ? 2.5 * att_f : 2 * att_f;
  }
  const bool no_probs = flash || fused;  // the s x s probabilities never go through HBM
  // Memory-bound element-wise kernels (bytes moved through HBM).
  const double region = l.sequence_parallel ? double(t) : 1.0;  // SP shards LN/dropout regions
  const double E = double(T) * double(h) / region;
  const double ln_bytes = 2 * (2 * e) * E;       // 2 LayerNorms: read + write
  const double bda_bytes = 2 * (3 * e + 1) * E;  // 2 bias-dropout-add: x, residual, out, mask
  // bias-GeLU read + write; SwiGLU reads gate and up, writes their product
  const double gelu_bytes = (sh.swiglu ? 3 : 2) * e * double(T) * double(sh.f) / double(t);
  // rotary embedding of q and k, in place: read + write
  const double rope_bytes = sh.rope ? 2 * e * double(T) * double((sh.a + sh.G) * sh.D) / double(t) : 0.0;
  const double S = double(b) * double(heads) * double(s) * double(skv);
  const double softmax_bytes = no_probs ? 0.0 : (4 * e + 1) * S;  // fused scale-mask-softmax + dropout (mask 1 byte)
  const double elem_f = (ln_bytes + bda_bytes + gelu_bytes + rope_bytes) / g.hbm_bw;
  const double attn_elem_f = softmax_bytes / g.hbm_bw;
  // Kernel launches not covered by the GEMMs above (LN, dropout, softmax, GeLU, adds, copies).
  const double launches_f = 12 * g.kernel_overhead;
  if (t > 1)
    layer_tp_comm(r, l, c, double(T) * double(h) * e,
                  {f_qkv, f_proj, f_fc1, f_fc2, d_qkv, d_proj, d_fc1, d_fc2, w_qkv, w_fc1});
  // What selective recompute redoes: the attention core (Megatron-Core checkpoints the fused
  // kernel's forward too); this trainer's flash-style backward already recomputes it.
  r.attn_core = flash ? 0.0 : att_f + attn_elem_f;
  layer_cp_comm(r, sh, l, c, e, att_f, att_b);
  r.fwd = lin_f + att_f + elem_f + attn_elem_f + launches_f + r.tp_fwd + r.cp_fwd;
  r.bwd = lin_b + att_b + 2 * (elem_f + attn_elem_f + launches_f) + r.tp_bwd + r.cp_bwd;
  return r;
}

// One MoE layer's times: the dense layer's (`dense`) with its MLP replaced by the router
// (h x E), the E / ep local experts' grouped GEMMs over the k b s tokens routed to this
// rank (balanced: b s k ep / E rows an expert), the shared expert, the permutation,
// activation and weighting of the routed rows through HBM, and with ep > 1 the dispatch
// and combine all-to-alls of (ep - 1) / ep of the b s k h routed elements, forward and
// backward, exposed whole.
LayerTime moe_layer_time(const Shape& sh, const Layout& l, const Cluster& c, Precision prec, const LayerTime& dense) {
  const GpuSpec& g = c.gpu;
  const double peak = prec == Precision::fp32 ? g.peak_flops * 0.5 : g.peak_flops;
  const double e = double(element_bytes(prec));
  const int64_t t = l.tp, T = l.micro_batch * sh.s, h = sh.h, pre = sh.pre() / t, ffn = sh.f / t;
  const double dense_f = gemm_time(g, peak, T, pre, h) + gemm_time(g, peak, T, h, ffn);
  const double dense_b = gemm_time(g, peak, T, h, pre) + gemm_time(g, peak, T, ffn, h) + gemm_time(g, peak, h, pre, T) +
                         gemm_time(g, peak, ffn, h, T);
  const double dense_elem = (sh.swiglu ? 3 : 2) * e * double(T) * double(sh.f) / double(t) / g.hbm_bw;
  const int64_t local = std::max<int64_t>(1, sh.E / l.ep);
  const int64_t rows = std::max<int64_t>(1, T * sh.k * l.ep / sh.E), pm = sh.moe_pre() / l.etp, fm = sh.Fm / l.etp;
  double f = double(local) * (gemm_time(g, peak, rows, pm, h) + gemm_time(g, peak, rows, h, fm)) +
             gemm_time(g, peak, T, sh.E, h);
  double b = double(local) * (gemm_time(g, peak, rows, h, pm) + gemm_time(g, peak, rows, fm, h) +
                              gemm_time(g, peak, h, pm, rows) + gemm_time(g, peak, fm, h, rows)) +
             gemm_time(g, peak, T, h, sh.E) + gemm_time(g, peak, h, sh.E, T);
  if (sh.S > 0) {
    const int64_t sp = sh.s_pre() / t, ss = sh.S / t;
    f += gemm_time(g, peak, T, sp, h) + gemm_time(g, peak, T, h, ss);
    b += gemm_time(g, peak, T, h, sp) + gemm_time(g, peak, T, ss, h) + gemm_time(g, peak, h, sp, T) +
         gemm_time(g, peak, ss, h, T);
  }
  const double routed = double(T) * double(sh.k);
  const double elem = (4 * e * routed * double(h) + (sh.swiglu ? 6 : 5) * e * routed * double(fm) +
                       4 * 4.0 * double(T) * double(sh.E)) /
                      g.hbm_bw;
  LayerTime r = dense;
  if (l.ep > 1) {
    const GroupLink k = group_link(c, l.tp, l.ep);
    const double epd = double(l.ep), one = (epd - 1) / epd * routed * double(h) * e / k.bw + (epd - 1) * k.alpha;
    r.ep_fwd = r.ep_bwd = 2 * one;
  }
  r.fwd += f + elem + r.ep_fwd - dense_f - dense_elem;
  r.bwd += b + 2 * elem + r.ep_bwd - dense_b - 2 * dense_elem;
  return r;
}

// Activation bytes one transformer layer keeps for one microbatch (Korthikanti et al.
// 2022, Table 2, 16-bit; doubled for fp32): per s b h, 10 replicated over tp (the two
// norms' inputs 4, the QKV and MLP inputs 2 + 2, two dropout masks 1 + 1) and 24 split
// (Q and K 4, V 2, the projection's input 2, fc1's output 8, GeLU's 8), the latter counted
// from the shape: Q, K 2 (a + G) D, V 2 G D, projection input 2 a D, fc1's output 2 pre
// (gate and up under SwiGLU), the activation's output 2 f, over h.
double layer_activation_bytes(const Shape& sh, const Layout& l, Precision prec, RecomputeGranularity rc) {
  const double sbh = double(sh.s) * double(l.micro_batch) * double(sh.h);
  const double t = double(l.tp);
  const double att = 5.0 * double(sh.a) * double(sh.s_kv > 0 ? sh.s_kv : sh.s) / double(sh.h);
  const double scale = prec == Precision::fp32 ? 2.0 : 1.0;
  const double split =
      double(2 * (sh.a + sh.G) * sh.D + 2 * sh.G * sh.D + 2 * sh.att() + 2 * sh.pre() + 2 * sh.f) / double(sh.h);
  const double all = 10.0 + split;
  double per;
  if (rc == RecomputeGranularity::full) {
    per = 2.0 * (l.sequence_parallel ? 1.0 / t : 1.0);  // the layer input only
  } else if (t == 1) {
    per = rc == RecomputeGranularity::selective ? all : all + att;
  } else if (l.sequence_parallel) {
    per = rc == RecomputeGranularity::selective ? all / t : all / t + att / t;
  } else {
    per = rc == RecomputeGranularity::selective ? 10.0 + split / t : 10.0 + split / t + att / t;
  }
  return per * sbh * scale;
}

// Bytes mtnlg's trainer keeps for the backward of one microbatch through one model chunk
// of `layers` layers (model/gpt.cpp GptChunk::LayerActs and Saved; e = the compute dtype,
// statistics in fp32 (fp64 runs keep them in fp64, not planned here), token ids i32).
// What an MoE layer keeps beside the dense layer's tensors, less the dense MLP's, per
// microbatch (model/moe.hpp MoeActs, dropless: every token's k slots are rows): router
// logits [N, E] (the router's dtype: fp32, fp64 with moe_router_dtype fp64), top-k
// weights [N, k] (fp32) and experts [N, k] (i32), with the balancing loss its scores
// [N, E] and counts [groups, E] (the router's dtype); the dispatched rows [Nk, h], fc1's output
// [Nk, pre_m], the activation and its weighted copy [Nk, Fm] each, the row and slot maps
// (3 x i32); the shared expert's fc1 output, activation and output (and gate logit).
double trainer_moe_extra_bytes(const Shape& sh, const Layout& l, double e, double N) {
  const double t = double(l.tp), rows = N * double(sh.k), E = double(sh.E), w = 4.0;
  const double groups = sh.seq_aux ? double(l.micro_batch) : 1.0, r = sh.router64 ? 8.0 : 4.0;
  double b = r * N * E + w * N * double(sh.k) + w * N * double(sh.k);
  if (sh.aux) b += r * N * E + r * groups * E;
  b += e * rows * (double(sh.h) + double(sh.moe_pre()) + 2 * double(sh.Fm)) + w * (2 * rows + N * double(sh.k));
  if (sh.S > 0) b += e * N * (double(sh.s_pre()) + double(sh.S) + double(sh.h)) + (sh.s_gate ? e * N : 0.0);
  return b - e * N * double(sh.pre() + sh.f) / t;
}

double trainer_chunk_saved_bytes(const Shape& sh, const Layout& l, Precision prec, int64_t layers, bool head,
                                 int64_t moe_layers = 0) {
  const double e = double(element_bytes(prec)), w = 4.0;
  const double t = double(l.tp), N = double(l.micro_batch) * double(sh.s), C = double(sh.h);
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double R = sp ? N / t : N;  // rows of the residual stream on this rank
  double layer;
  if (l.recompute == RecomputeGranularity::full) {
    layer = R * C * e;  // the layer input only
  } else {
    // x_in, ln1, x2, ln2 [R, C]; qkv [N, (a + 2G) D / t]; att [N, a D / t]; fc1 [N, pre/t]
    // (gate and up under SwiGLU), gel [N, f/t]; under SP the all-gathered ln1, ln2 [N, C];
    // the norms' statistics in fp32, 4 x [R] for LayerNorm (mean, rstd), 2 x [R] for
    // RMSNorm (rstd); then the attention
    // core's: flash, the log-sum-exp [b, a/t, s] in fp32 (selective keeps the same: no
    // [s, s] tensor exists); unfused, the probabilities [b, a/t, s, s] in the compute dtype,
    // nothing under selective (the backward redoes them). qk_layernorm also keeps qkv before
    // the norms and their statistics in fp32, one per query and key head of each row.
    const double bas = double(l.micro_batch) * double(sh.a) / t * double(sh.s);
    const double core = !sh.unfused                                 ? w * bas
                        : l.recompute == RecomputeGranularity::none ? e * bas * double(sh.s)
                                                                    : 0.0;
    layer = e * (4 * R * C + N * double(sh.qkv()) / t + N * double(sh.att()) / t + N * double(sh.pre() + sh.f) / t) +
            (sp ? 2 * N * C * e : 0.0) + w * double(2 * sh.norm_params()) * R + core;
    if (sh.qk_norm) layer += e * N * double(sh.qkv()) / t + w * N * double(sh.a + sh.G) / t;
  }
  double b = double(layers) * layer + 2 * N * 4;  // + token ids and targets (i32)
  if (moe_layers > 0 && l.recompute != RecomputeGranularity::full)
    b += double(moe_layers) * trainer_moe_extra_bytes(sh, l, e, N);
  if (head)  // chunk output, the final norm's statistics and its output's gradient (all N rows under SP);
    b += R * C * e + double(sh.norm_params()) * R * w +
         N * C * e;  // the logits live only chunk by chunk (trainer_logits_bytes)
  return b;
}

// The last stage's logits while its head runs: one chunk of rows at a time
// (model::logits_chunk_rows), in the compute dtype, with the cross-entropy statistics of
// all rows (max, sum of exp, target logit, fp32).
double trainer_logits_bytes(const Shape& sh, const Layout& l, Precision prec) {
  const int64_t N = l.micro_batch * sh.s, V_local = sh.V / l.tp;
  const int64_t rows = model::logits_chunk_rows(N, V_local, model::GptConfig{}.logits_chunk_elements);
  return double(rows) * double(V_local) * double(element_bytes(prec)) + 3.0 * double(N) * 4.0;
}

// The most bytes pipeline rank `st` keeps at once: its schedule table walked with each
// (microbatch, chunk) forward adding that chunk's saved bytes and its backward removing
// them (what app/train/pipeline_executor.cpp reports as the peak of saved activations).
double trainer_stage_activation_bytes(const Shape& sh, const Layout& l, Precision prec, int64_t st, int64_t m) {
  const int64_t per_chunk = l.stage_layers[static_cast<size_t>(st)] / l.vp;
  const std::vector<schedules::PipeAction> table = schedules::schedule_for(l.pp, st, m, l.vp);
  double held = 0, peak = 0;
  for (const auto& a : table) {
    const bool head = st == l.pp - 1 && a.chunk == l.vp - 1;
    const int64_t moe = moe_layers_of(sh, chunk_layers(l, st, a.chunk));
    if (a.op == schedules::PipeOp::forward) {
      held += trainer_chunk_saved_bytes(sh, l, prec, per_chunk, head, moe);
      peak = std::max(peak, held);
    } else if (a.op == schedules::PipeOp::backward) {
      held -= trainer_chunk_saved_bytes(sh, l, prec, per_chunk, head, moe);
    }
  }
  return peak;
}

// The most bytes pipeline rank `st` holds at once in sends not yet waited for: the
// trainer's executor posts each send (one message of `msg` bytes, the chunk output or
// its input gradient) nonblocking and waits for it at schedules::send_release_points
// (what app/train/pipeline_executor.cpp reports as the peak of send buffers).
// `release`: schedules::send_release_points_all(pp, m, vp)[st].
double trainer_stage_send_bytes(const Layout& l, int64_t st, int64_t m, double msg,
                                const std::vector<int64_t>& release) {
  if (l.pp == 1) return 0;
  const auto table = schedules::schedule_for(l.pp, st, m, l.vp);
  std::vector<int64_t> due(table.size() + 1, 0);
  for (int64_t k : release)
    if (k >= 0) ++due[static_cast<size_t>(k)];
  double held = 0, peak = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    if (release[i] >= 0) {  // a send
      held += msg;
      peak = std::max(peak, held);
    }
    held -= double(due[i]) * msg;
  }
  return peak;
}

}  // namespace

int64_t cp_a2a_of(const Recipe& r) {
  const auto& h = r.parallel.hierarchical_context_parallel_sizes;
  return h.empty() ? 1 : h.front();
}

bool trainer_unfused_attention(const Recipe& r, const Cluster& c) {
  if (!c.software.trainer_activations) return false;
  const AttentionBackend a = r.model.attention_backend;
  if (a != AttentionBackend::automatic) return a == AttentionBackend::unfused;
  if (c.gpu.name.rfind("cpu", 0) == 0) return false;
  // On a GPU, auto is cuDNN's fused (flash) attention where cuDNN takes the problem:
  // bf16/fp16 and head sizes that are multiples of 8 up to 256 (cuDNN 9.19 on sm90, the
  // plan table of test/core/cuda/test_cudnn_plan_table.cpp; cuDNN assumed present;
  // the trainer's banner says when it is not).
  const int64_t d = r.model.head_dim();
  return r.training.precision == Precision::fp32 || d % 8 != 0 || d > 256;
}

double cudnn_attention_bytes(int64_t b, int64_t heads, int64_t s, int64_t d, bool deterministic, bool grouped) {
  auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  double bwd = 256.0 + double(up(b * heads * s * 4, 128));
  bwd += deterministic ? 2.0 * double(b * heads * up(s, 64) * up(s, 128)) : 4.0 * double(b * heads * s * d);
  if (grouped) bwd += 4.0 * double(b * heads * s * d);
  return std::max(256.0, bwd);
}

double gemm_seconds(const GpuSpec& g, int64_t M, int64_t N, int64_t K, int64_t batch) {
  return gemm_time(g, g.peak_flops, M, N, K, batch);
}

double attention_seconds(const GpuSpec& g, int64_t seq, int64_t head_dim, int64_t batch_heads, bool backward) {
  return fused_attention_time(g, g.peak_flops, seq, head_dim, batch_heads, backward);
}

// ---- names, layouts ---------------------------------------------------------------------

const GpuSpec& gpu_spec(const std::string& name) {
  std::string n = name;
  if (n == "a100") n = "a100-80g";
  if (n == "h100") n = "h100-80g";
  if (n == "h200" || n == "h200-141gb") n = "h200-141g";
  for (auto& g : gpu_table())
    if (g.name == n) return g;
  std::string valid;
  for (auto& g : gpu_table()) valid += (valid.empty() ? "" : ", ") + g.name;
  throw_input("--gpu {}: unknown GPU; valid: {}", name, valid);
}

const GpuSpec* gpu_spec_for_device(const std::string& device_name) {
  std::string n;
  for (char c : device_name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // The table holds SXM parts; PCIe and NVL boards have other clocks and peaks.
  if (n.find("pcie") != std::string::npos || n.find("nvl") != std::string::npos) return nullptr;
  for (const char* model : {"h200", "h100", "a100"})
    if (n.find(model) != std::string::npos) return &gpu_spec(model);
  return nullptr;
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> v;
  for (auto& g : gpu_table()) v.push_back(g.name);
  return v;
}

const SoftwareProfile& software_profile(const std::string& name) {
  for (auto& p : software_table())
    if (p.name == name) return p;
  std::string valid;
  for (auto& p : software_table()) valid += (valid.empty() ? "" : ", ") + p.name;
  throw_input("--software {}: unknown software profile; valid: {}", name, valid);
}

std::vector<std::string> software_names() {
  std::vector<std::string> v;
  for (auto& p : software_table()) v.push_back(p.name);
  return v;
}

std::string Layout::describe() const {
  const char* rc = recompute == RecomputeGranularity::full        ? "full"
                   : recompute == RecomputeGranularity::selective ? "selective"
                                                                  : "none";
  return fmt::format("tp{} pp{} dp{}{}{} vp{} mb{} recompute={} sp={} zero1={}", tp, pp, dp,
                     cp > 1 ? fmt::format(" cp{} {}", cp, to_string(cp_comm)) : "",
                     ep > 1 || etp > 1 ? fmt::format(" ep{} etp{}", ep, etp) : "", vp, micro_batch, rc,
                     sequence_parallel ? 1 : 0, distributed_optimizer ? 1 : 0);
}

std::string layout_problem(const Recipe& r, const Layout& l) {
  const auto& m = r.model;
  const auto& t = r.training;
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.cp < 1 || l.vp < 1 || l.micro_batch < 1) return "sizes must be >= 1";
  if (m.num_attention_heads % l.tp != 0) return "attention heads not divisible by tp";
  if (m.query_groups() % l.tp != 0) return "query groups not divisible by tp";
  const int64_t ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size;
  if (ffn % l.tp != 0) return "ffn hidden size not divisible by tp";
  if (m.num_layers < l.pp) return "fewer layers than pipeline stages";
  if (static_cast<int64_t>(l.stage_layers.size()) != l.pp) return "stage layer list does not match pp";
  if (l.cp > 1) {
    if (m.seq_length % (2 * l.cp) != 0) return "context parallel needs seq_length divisible by 2 x cp";
    if (l.cp_comm == CpCommType::a2a &&
        ((m.num_attention_heads / l.tp) % l.cp != 0 || (m.query_groups() / l.tp) % l.cp != 0))
      return "a2a context parallel needs heads and query groups per tp rank divisible by cp";
    if (l.cp_comm == CpCommType::a2a_p2p &&
        (l.cp_a2a < 1 || l.cp % l.cp_a2a != 0 || (m.num_attention_heads / l.tp) % l.cp_a2a != 0 ||
         (m.query_groups() / l.tp) % l.cp_a2a != 0))
      return "a2a+p2p needs cp divisible by its all-to-all group (hierarchical_context_parallel_sizes[0]), and heads "
             "and query groups per tp rank divisible by that group";
  }
  if (l.ep < 1 || l.etp < 1) return "sizes must be >= 1";
  if ((l.ep > 1 || l.etp > 1) && !m.moe.enabled()) return "expert parallelism needs MoE layers";
  if (m.moe.enabled() && m.moe.num_experts % l.ep != 0) return "experts not divisible by ep";
  if ((l.tp * l.cp * l.dp) % (l.ep * l.etp) != 0) return "tp x cp x dp not divisible by ep x etp";
  if (m.moe.enabled() && l.tp > 1 && !l.sequence_parallel) return "MoE layers with tp > 1 need sequence parallel";
  if (l.sequence_parallel && (l.tp < 2 || (m.seq_length / l.cp) % l.tp != 0))
    return "sequence parallel needs tp > 1 dividing seq_length / cp";
  if (l.distributed_optimizer && l.replicas() < 2) return "distributed optimizer needs dp x cp > 1";
  const int64_t unit = l.micro_batch * l.dp;
  if (t.global_batch_size % unit != 0) return "global batch not divisible by micro_batch x dp";
  if (l.vp > 1) {
    if (l.pp < 2) return "interleaving needs pp >= 2";
    for (auto x : l.stage_layers)
      if (x != l.stage_layers[0] || x % l.vp != 0) return "interleaving needs equal stages divisible by vp";
    int64_t min_batch = t.rampup_batch_size ? t.rampup_batch_size->start : t.global_batch_size;
    if ((min_batch / unit) % l.pp != 0) return "interleaving needs microbatches % pp == 0";
  }
  return "";
}

std::string ramp_problem(const Recipe& r, const Layout& l) {
  const int64_t unit = l.micro_batch * l.dp;
  const auto& rb = r.training.rampup_batch_size;
  if (rb && (rb->start % unit != 0 || rb->increment % unit != 0))
    return fmt::format("batch ramp start {} / increment {} not divisible by micro_batch x dp = {}", rb->start,
                       rb->increment, unit);
  return "";
}

Layout layout_from_recipe(const Recipe& r, int64_t gpus) {
  if (gpus < 1) throw_input("--gpus {}: must be at least 1", gpus);
  const std::string where = r.source_path.empty() ? r.name : r.source_path;
  const int64_t mp = r.tp() * r.pp() * r.cp();
  if (gpus % mp != 0) {
    if (r.cp() > 1)
      throw_input(
          "{}: {} GPUs is not divisible by tensor_model_parallel_size x context_parallel_size x "
          "pipeline_model_parallel_size = {} x {} x {}",
          where, gpus, r.tp(), r.cp(), r.pp());
    throw_input("{}: {} GPUs is not divisible by tensor_model_parallel_size x pipeline_model_parallel_size = {} x {}",
                where, gpus, r.tp(), r.pp());
  }
  if (r.training.global_batch_size % (r.training.micro_batch_size * (gpus / mp)) != 0)
    throw_input(
        "{}: training.global_batch_size ({}) must be divisible by micro_batch_size x data_parallel_size = {} x {}",
        where, r.training.global_batch_size, r.training.micro_batch_size, gpus / mp);
  Layout l;
  l.tp = r.tp();
  l.pp = r.pp();
  l.cp = r.cp();
  l.cp_comm = r.parallel.cp_comm_type;
  l.cp_a2a = cp_a2a_of(r);
  if (r.model.moe.enabled()) {
    l.ep = r.ep();
    l.etp = r.etp();
  }
  l.dp = gpus / mp;
  l.micro_batch = r.training.micro_batch_size;
  l.recompute = r.parallel.recompute_granularity;
  l.sequence_parallel = r.parallel.sequence_parallel;
  l.distributed_optimizer = r.parallel.use_distributed_optimizer;
  l.stage_layers =
      r.parallel.pipeline_layers.empty() ? even_split(r.model.num_layers, l.pp) : r.parallel.pipeline_layers;
  if (int64_t nv = r.parallel.num_layers_per_virtual_pipeline_stage; nv > 0) l.vp = (r.model.num_layers / l.pp) / nv;
  std::string why = layout_problem(r, l);
  if (!why.empty()) throw_input("{}: layout {} on {} GPUs cannot exist: {}", where, l.describe(), gpus, why);
  return l;
}

// ---- communication bytes ------------------------------------------------------------------

// Bytes one rank sends for one layer's attention across the cp group, one microbatch,
// forward and backward (CommBytes::cp).
double cp_layer_bytes(const Shape& sh, const Layout& l, double e, bool forward) {
  if (l.cp < 2) return 0;
  const double t = double(l.tp), rows = double(l.micro_batch) * double(sh.s), cp = double(l.cp);
  const double kv = rows * 2.0 * double(sh.G * sh.D) / t * e, dkv = kv * kCpGradBytes / e;
  const double qkv = rows * double(sh.qkv()) / t * e, out = rows * double(sh.att()) / t * e;
  // p2p backward: cp - 1 K/V blocks and cp dK/dV buffers (the last one home); all_gather
  // backward: the K/V gathered again, the dK/dV reduce-scattered.
  switch (l.cp_comm) {
    case CpCommType::p2p: return forward ? (cp - 1) * kv : (cp - 1) * kv + cp * dkv;
    case CpCommType::all_gather: return forward ? (cp - 1) * kv : (cp - 1) * (kv + dkv);
    case CpCommType::a2a:
    case CpCommType::a2a_p2p: break;
  }
  // a2a at m ranks, then (a2a+p2p) the K/V ring across cp / m groups (layer_cp_comm).
  const double m = l.cp_comm == CpCommType::a2a ? cp : double(l.cp_a2a), ring = cp / m, share = (m - 1) / m;
  const double a2a = forward ? share * (qkv + out) : share * (2 * qkv + 2 * out + rows * double(sh.a) / t * 4.0);
  const double p2p = ring > 1 ? (forward ? (ring - 1) * kv : (ring - 1) * kv + ring * dkv) : 0.0;
  return a2a + p2p;
}

CommBytes comm_bytes_per_iteration(const Recipe& r, const Layout& l, int64_t B) {
  const Shape sh = shape_of(r, l.tp, l.cp);
  const double e = double(element_bytes(r.training.precision));
  const double grad_e = 4.0;  // gradients are reduced in fp32 (bf16/fp16: fp32 main grads; fp32: fp32)
  const double m = double(B) / double(l.micro_batch * l.dp);
  const double act = double(l.micro_batch) * double(sh.s) * double(sh.h) * e;  // b*s*h elements
  CommBytes c;
  const double t = double(l.tp), d = double(l.replicas());
  double tp_max = 0, dp_max = 0, cp_max = 0, ep_max = 0;
  for (int64_t st = 0; st < l.pp; ++st) {
    const double layers = double(l.stage_layers[static_cast<size_t>(st)]);
    const double params = stage_params_per_gpu(sh, l, st);
    const bool first = st == 0, last = st == l.pp - 1;
    if (l.tp > 1) {
      const double per_ar = 2 * (t - 1) / t * act;
      const double n_ar = 4 + (l.recompute == RecomputeGranularity::full ? 2 : 0);
      double v = m * layers * n_ar * per_ar;
      if (first) v += m * per_ar;  // vocab-parallel embedding all-reduce (forward)
      if (last) v += m * 3 * 2 * (t - 1) / t * double(l.micro_batch * sh.s) * 4.0;  // CE: max, target, sum-exp (fp32)
      tp_max = std::max(tp_max, v);
    }
    // The dense parameters over dp x cp, the routed experts over their replicas.
    const double experts = stage_expert_params_per_gpu(sh, l, st), de = double(l.expert_replicas());
    auto reduce = [&](double n, double g) {
      return l.distributed_optimizer ? (g - 1) / g * n * grad_e + (g - 1) / g * n * e : 2 * (g - 1) / g * n * grad_e;
    };
    dp_max = std::max(dp_max, reduce(params - experts, d) + reduce(experts, de));
    const double fwd_passes = l.recompute == RecomputeGranularity::full ? 2.0 : 1.0;
    cp_max =
        std::max(cp_max, m * layers * (fwd_passes * cp_layer_bytes(sh, l, e, true) + cp_layer_bytes(sh, l, e, false)));
    if (l.ep > 1) {  // dispatch and combine, forward (again under full recompute) and backward
      const double epd = double(l.ep), routed = double(l.micro_batch) * double(sh.s) * double(sh.k) * double(sh.h) * e;
      ep_max =
          std::max(ep_max, m * double(stage_moe_layers(sh, l, st)) * (2 * fwd_passes + 2) * (epd - 1) / epd * routed);
    }
  }
  c.tp = tp_max;
  c.dp = dp_max;
  c.cp = cp_max;
  c.ep = ep_max;
  if (l.pp > 1) {
    // A middle stage sends one activation forward and one gradient backward per
    // microbatch per chunk; with interleaving the last rank also passes chunk outputs
    // back to the first rank, so every rank sends 2*v per microbatch except the
    // ends of the non-interleaved pipeline.
    const double per = l.sequence_parallel ? act / t : act;
    // pp == 2 without interleaving has no middle stage: each end sends one direction.
    const double sends = (l.pp == 2 && l.vp == 1) ? 1.0 : 2.0 * double(l.vp);
    c.pp = m * sends * per;
  }
  return c;
}

// ---- memory and time -------------------------------------------------------------------

namespace {

struct Computed {
  std::vector<StageMemory> mem;
  std::vector<StageTime> time;
};

// What every stage of a layout shares: the model's shape on one tensor rank, the
// precision, one layer's times and activation bytes, the pipeline message and link.
struct StageInputs {
  Shape sh;
  Precision prec;
  double e, t, d, peak;  // d: the replicas (dp x cp) gradients and ZeRO-1 shards are over
  LayerTime lt;
  LayerTime lt_moe;                          // an MoE layer's (when the model has them)
  double per_layer_act, per_layer_full_act;  // bytes a layer keeps / a layer's full activations
  int64_t T;                                 // tokens per micro batch
  double act_msg, p2p_one;                   // pipeline message bytes, one transfer's time
  GroupLink pp_link;
  int64_t m_full;              // micro batches per step at the full batch
  bool deterministic = false;  // training.deterministic_mode (cuDNN's attention backward)
  bool grouped = false;        // grouped-query attention (num_query_groups < heads)
};

StageInputs stage_inputs(const Recipe& r, const Layout& l, const Cluster& c) {
  Shape sh = shape_of(r, l.tp, l.cp);
  sh.unfused = l.cp == 1 && trainer_unfused_attention(r, c);  // attention across cp ranks is the flash form
  const Precision prec = r.training.precision;
  const double e = double(element_bytes(prec));
  const double t = double(l.tp), d = double(l.replicas());
  const GpuSpec& g = c.gpu;
  const double peak = prec == Precision::fp32 ? g.peak_flops * 0.5 : g.peak_flops;
  const LayerTime lt = layer_time(sh, l, c, prec);
  const LayerTime lt_moe = sh.E > 0 ? moe_layer_time(sh, l, c, prec, lt) : lt;
  // A fused attention kernel keeps no s x s probabilities: without recompute a layer keeps
  // what selective recompute keeps (Korthikanti Table 2 without the 5as/h term).
  const bool no_probs = c.software.fused_attention && l.recompute == RecomputeGranularity::none;
  const double per_layer_act =
      layer_activation_bytes(sh, l, prec, no_probs ? RecomputeGranularity::selective : l.recompute);
  const double per_layer_full_act = layer_activation_bytes(sh, l, prec, RecomputeGranularity::none);
  const int64_t T = l.micro_batch * sh.s;
  const double act_msg = double(T) * double(sh.h) * e / (l.sequence_parallel ? t : 1.0);
  // Point-to-point to the neighbouring stage: over NVLink when both stages sit in one node
  // (one HCA per GPU otherwise). Under sequence parallelism each tensor rank already holds
  // only its 1/t of the sequence and sends that. Otherwise, with scatter/gather, each
  // tensor rank sends 1/t of the (replicated) activation and the receiving stage
  // all-gathers the pieces over NVLink; without it every tensor rank sends the whole.
  const GroupLink pp_link = group_link(c, l.tp * l.dp, 2);
  const bool scatter = c.software.scatter_gather_p2p && !l.sequence_parallel && l.tp > 1;
  const double wire_msg = scatter ? act_msg / t : act_msg;
  const double gather =
      scatter ? double(l.tp - 1) / t * act_msg / c.gpu.nvlink_bus_bw + double(l.tp - 1) * c.gpu.nvlink_alpha : 0;
  const double p2p_one = l.pp > 1 ? pp_link.alpha + wire_msg / pp_link.bw + gather : 0;
  const int64_t m_full = r.training.global_batch_size / (l.micro_batch * l.dp);
  return StageInputs{sh,
                     prec,
                     e,
                     t,
                     d,
                     peak,
                     lt,
                     lt_moe,
                     per_layer_act,
                     per_layer_full_act,
                     T,
                     act_msg,
                     p2p_one,
                     pp_link,
                     m_full,
                     r.training.deterministic_mode,
                     r.model.query_groups() != r.model.num_attention_heads};
}

// The parameters stage st holds and their bytes: weights, gradients and optimizer state
// (ZeRO-1 shards when the optimizer is distributed).
void stage_parameter_memory(StageMemory& mem, const Layout& l, const StageInputs& x, int64_t st) {
  const double d = x.d;
  const double params = stage_params_per_gpu(x.sh, l, st), experts = stage_expert_params_per_gpu(x.sh, l, st);
  mem.params = params;
  // ZeRO-1 shards are ceil(params / d): the trainer pads the buffer to a multiple of d; an
  // MoE model's routed experts are a region of their own, sharded over their replicas.
  const double de = double(l.expert_replicas());
  const double shard = l.distributed_optimizer
                           ? std::ceil((params - experts) / d) + (experts > 0 ? std::ceil(experts / de) : 0.0)
                           : params;
  if (x.prec == Precision::fp32) {
    mem.weights = 4 * params;
    mem.gradients = 4 * params;
    mem.optimizer = 8 * shard;  // Adam m, v
  } else {
    mem.weights = 2 * params;    // bf16/fp16 model weights
    mem.gradients = 4 * params;  // fp32 gradient accumulation buffer (Megatron)
    mem.optimizer = 12 * shard;  // fp32 master + m + v
  }
}

// The activations stage st keeps (with the embedding's and the logits'); returns the bytes
// a recompute re-materializes in the backward's workspace, beyond those.
double stage_activation_memory(StageMemory& mem, const Layout& l, const Cluster& c, const StageInputs& x, int64_t st) {
  const Shape& sh = x.sh;
  const Precision prec = x.prec;
  const int64_t m_full = x.m_full, layers = mem.layers;
  const bool first = st == 0, last = st == l.pp - 1;
  // In-flight microbatches on this stage under 1F1B: min(pp - stage, m); interleaving
  // adds (pp-1)/(pp*v) on the first stage (Korthikanti et al. §4.2.3).
  const double in_flight = double(std::min<int64_t>(l.pp - st, m_full));
  const double inter = l.vp > 1 ? 1.0 + double(l.pp - 1 - st) / double(l.pp * l.vp) : 1.0;
  double rematerialized = 0;  // recompute re-materializes one layer's full activations in its backward
  if (l.recompute != RecomputeGranularity::none && layers > 0) rematerialized = x.per_layer_full_act;
  if (c.software.trainer_activations) {
    // Everything the trainer keeps (head and token ids included); the layer a full
    // recompute re-materializes lives in the backward's workspace.
    mem.activations = trainer_stage_activation_bytes(sh, l, prec, st, m_full);
    if (last) mem.logits = trainer_logits_bytes(sh, l, prec);
    rematerialized = 0;
    if (l.recompute == RecomputeGranularity::full && layers > 0) {
      Layout kept_all = l;
      kept_all.recompute = RecomputeGranularity::none;
      const Layout& ka = kept_all;
      rematerialized = trainer_chunk_saved_bytes(sh, ka, prec, 1, false, stage_moe_layers(sh, l, st) > 0 ? 1 : 0) -
                       trainer_chunk_saved_bytes(sh, ka, prec, 0, false);
    }
  } else {
    mem.activations = in_flight * inter * double(layers) * x.per_layer_act + rematerialized;
    if (l.recompute != RecomputeGranularity::full)  // the MoE layers' routed rows (as the trainer keeps them)
      mem.activations += in_flight * inter * double(stage_moe_layers(sh, l, st)) *
                         trainer_moe_extra_bytes(sh, l, x.e, double(l.micro_batch) * double(sh.s));
    rematerialized = 0;
    if (first) mem.embedding = double(sh.s) * double(l.micro_batch) * double(sh.h) * double(l.pp) / x.t;
    if (last) mem.logits = 4.0 * double(sh.s) * double(l.micro_batch) * double(sh.V) / x.t;
  }
  return rematerialized;
}

// Stage st's send buffers and all its communication buffers (with NCCL's own,
// `nccl_buffers`).
void stage_comm_memory(StageMemory& mem, const Layout& l, const Cluster& c, const StageInputs& x, int64_t st,
                       double nccl_buffers, std::vector<std::vector<int64_t>>& releases) {
  const double act_msg = x.act_msg;
  if (c.software.trainer_activations) {
    // This trainer: the sends not yet waited for (exact, from the schedule), one receive
    // buffer for the incoming gradient (its received activations are the chunks' saved
    // inputs, counted above), NCCL channel buffers (~0.5 GiB).
    if (l.pp > 1 && releases.empty()) releases = schedules::send_release_points_all(l.pp, x.m_full, l.vp);
    mem.send_buffers =
        l.pp > 1 ? trainer_stage_send_bytes(l, st, x.m_full, act_msg, releases[static_cast<size_t>(st)]) : 0;
    mem.comm_buffers = mem.send_buffers + (l.pp > 1 ? act_msg : 0) + nccl_buffers;
  } else {
    // Megatron waits for each batched exchange: two send buffers and two receive buffers
    // + NCCL channel buffers (~0.5 GiB).
    mem.send_buffers = l.pp > 1 ? 2 * act_msg : 0;
    mem.comm_buffers = (l.pp > 1 ? 4 * act_msg : 0) + nccl_buffers;
  }
}

// Memory of pipeline stage st (the trainer's exact accounting for the mtnlg profile,
// Korthikanti et al.'s per-layer bytes for Megatron's). `releases`: the trainer's send
// release points per stage, computed once on first use.
StageMemory stage_memory(const Layout& l, const Cluster& c, const StageInputs& x, int64_t st,
                         std::vector<std::vector<int64_t>>& releases) {
  const Shape& sh = x.sh;
  // NCCL's channel buffers (~0.5 GiB), allocated by NCCL itself; a single GPU sets up no
  // NCCL group (every group has one rank), so has none.
  const double nccl_buffers = l.gpus() > 1 ? 0.5 * kGiB : 0.0;
  StageMemory mem;
  mem.stage = st;
  mem.layers = l.stage_layers[static_cast<size_t>(st)];
  stage_parameter_memory(mem, l, x, st);
  const double rematerialized = stage_activation_memory(mem, l, c, x, st);
  stage_comm_memory(mem, l, c, x, st, nccl_buffers, releases);
  // CUDA context + cuBLAS workspace (~1 GiB) and allocator fragmentation (5% of the rest).
  const double rest = mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.embedding + mem.logits;
  // cuDNN's flash attention: its workspace and dQ accumulator, allocated for each call
  // (the largest, the backward's, at most one at a time on the one stream).
  if (c.software.trainer_activations && !sh.unfused && c.gpu.name.rfind("cpu", 0) != 0 && mem.layers > 0)
    mem.attention_workspace = c.attention_workspace >= 0 ? c.attention_workspace
                                                         : cudnn_attention_bytes(l.micro_batch, sh.a / l.tp, sh.s, sh.D,
                                                                                 x.deterministic, x.grouped);
  mem.workspace = 1.0 * kGiB + 0.05 * rest + rematerialized + mem.attention_workspace;
  mem.total = rest + mem.comm_buffers + mem.workspace;
  // What the allocator itself hands out (measured on an H200: a 1.3B at micro batch 1
  // with full recompute 22.73 GiB, this 22.74; at micro batch 2 without 34.52, this 34.51).
  mem.allocator =
      rest + (mem.comm_buffers - nccl_buffers) + rematerialized + kCublasWorkspace + mem.attention_workspace;
  return mem;
}

// Time of pipeline stage st: its layers' forward and backward (recompute included), the
// embedding on the first stage, the head and loss on the last, tp and p2p communication.
StageTime stage_time(const Layout& l, const Cluster& c, const StageInputs& x, int64_t st) {
  const Shape& sh = x.sh;
  const double e = x.e, t = x.t, peak = x.peak, p2p_one = x.p2p_one;
  const LayerTime& lt = x.lt;
  const GpuSpec& g = c.gpu;
  const GroupLink& pp_link = x.pp_link;
  const int64_t T = x.T;
  const int64_t layers = l.stage_layers[static_cast<size_t>(st)];
  const bool first = st == 0, last = st == l.pp - 1;
  StageTime tm;
  const int64_t moe = stage_moe_layers(sh, l, st), dense = layers - moe;
  const LayerTime& lm = x.lt_moe;
  tm.forward = double(dense) * lt.fwd + double(moe) * lm.fwd;
  tm.backward = double(dense) * lt.bwd + double(moe) * lm.bwd;
  tm.tp_comm = double(layers) * (lt.tp_fwd + lt.tp_bwd);
  if (l.recompute == RecomputeGranularity::full) {
    tm.backward += double(dense) * lt.fwd + double(moe) * lm.fwd;
    tm.tp_comm += double(layers) * lt.tp_fwd;
  } else if (l.recompute == RecomputeGranularity::selective) {
    tm.backward += double(layers) * lt.attn_core;
  }
  const GroupLink tpl = group_link(c, 1, l.tp);
  if (first) {
    // Embedding lookup + position add + dropout (memory bound) and the vocab-parallel all-reduce.
    const double bytes = 4 * e * double(T) * double(sh.h);
    tm.forward += bytes / g.hbm_bw + allreduce_time(double(T) * double(sh.h) * e, l.tp, tpl);
    tm.backward += 2 * bytes / g.hbm_bw;
  }
  if (last) {
    // Final LayerNorm, logits GEMM, vocab-parallel cross-entropy on fp32 logits.
    const double ln = 2 * e * double(T) * double(sh.h) / g.hbm_bw;
    const double logits = double(T) * double(sh.V) / t;  // logit elements on this tensor rank
    const double head_fwd = ln + gemm_time(g, peak, T, sh.V / l.tp, sh.h) +
                            c.software.ce_bytes_fwd * logits / g.hbm_bw +
                            3 * allreduce_time(double(T) * 4.0, l.tp, tpl);
    // The backward through the logits (their gradient, the tied embedding's gradient and the
    // final LayerNorm's output gradient), then the final LayerNorm's backward.
    const double head_logits_bwd = gemm_time(g, peak, T, sh.h, sh.V / l.tp) + gemm_time(g, peak, sh.h, sh.V / l.tp, T) +
                                   c.software.ce_bytes_bwd * logits / g.hbm_bw;
    tm.forward += head_fwd;
    (c.software.head_backward_in_forward ? tm.forward : tm.backward) += head_logits_bwd;
    tm.backward += 2 * ln;
  }
  // Exposed p2p per microbatch: an activation and a gradient per chunk, sent
  // blocking (Megatron pairs send/recv in one batched call; the transfer is on the
  // critical path of the steady state).
  tm.p2p = l.pp > 1 ? double(c.software.p2p_steps_per_microbatch) * double(l.vp) * p2p_one : 0;
  if (l.pp > 1 && l.vp > 1 && c.software.p2p_overlap) {
    // overlap_p2p_comm: each transfer runs beside the next chunk's compute; the latency
    // and what one chunk's forward cannot cover stay on the critical path.
    const double chunk = tm.forward / double(l.vp);
    const double one = std::max(pp_link.alpha, p2p_one - chunk);
    tm.p2p = double(c.software.p2p_steps_per_microbatch) * double(l.vp) * one;
  }
  const double share = compute_share(c, l);
  tm.forward *= share;
  tm.backward *= share;
  return tm;
}

Computed compute_stages(const Recipe& r, const Layout& l, const Cluster& c_in) {
  const Cluster c = effective(c_in);
  const StageInputs x = stage_inputs(r, l, c);
  Computed out;
  std::vector<std::vector<int64_t>> releases;  // the trainer's send release points, per stage (mtnlg profile)
  for (int64_t st = 0; st < l.pp; ++st) {
    out.mem.push_back(stage_memory(l, c, x, st, releases));
    out.time.push_back(stage_time(l, c, x, st));
  }
  return out;
}

struct IterParts {
  double pipeline = 0, dp = 0, opt = 0, bubble = 0;
};

// One stage's data-parallel gradient reduction (and, under the distributed optimizer, the
// parameter all-gather): what is exposed after the last backward. `m` microbatches.
double stage_dp_time(const Recipe& r, const Layout& l, const Cluster& c, const StageMemory& mem, const StageTime& tm,
                     int64_t m) {
  const int64_t n = l.replicas();  // gradients are reduced over dp x cp
  const GroupLink dpl = group_link(c, l.tp, n);
  const double e = double(element_bytes(r.training.precision));
  const double ge = r.training.precision == Precision::fp32 ? 4.0 : c.software.grad_reduce_bytes;
  if (c.software.dp_overlap && n > 1) {
    // --overlap-grad-reduce / --overlap-param-gather: buckets of max(40M, 1M x dp)
    // parameters; the gradient reduction runs during the last microbatch's backward of
    // this stage, the parameter all-gather during the first microbatch's forward. Exposed:
    // what the window cannot cover, at least the last (first) bucket.
    // Interleaved (Megatron-Core schedules.py, grad_sync_func / param_sync_func): each
    // model chunk's gradients are reduced as soon as its last backward is done and its
    // parameters gathered before its first forward; the v chunks finish p chunk-steps apart,
    // so all but the last (first) chunk's share overlap (v-1)/v x p microbatches' compute.
    const double v = double(l.vp);
    const double span = l.vp > 1 ? std::max(1.0, (v - 1.0) / v * double(std::min<int64_t>(l.pp, m))) : 1.0;
    const double bucket = std::min(mem.params, std::max(c.software.dp_bucket_params, 1e6 * double(n)));
    const double last = l.vp > 1 ? std::max(bucket, mem.params / v) : bucket;  // waits for the window's end
    if (l.distributed_optimizer) {
      const double rs = reduce_scatter_time(mem.params * ge, n, dpl);
      const double ag = reduce_scatter_time(mem.params * e, n, dpl);
      return std::max(reduce_scatter_time(last * ge, n, dpl), rs - span * tm.backward) +
             std::max(reduce_scatter_time(last * e, n, dpl), ag - span * tm.forward);
    }
    return std::max(allreduce_time(last * ge, n, dpl), allreduce_time(mem.params * ge, n, dpl) - span * tm.backward);
  }
  if (l.distributed_optimizer)
    return reduce_scatter_time(mem.params * ge, n, dpl) + reduce_scatter_time(mem.params * e, n, dpl);
  return allreduce_time(mem.params * ge, n, dpl);
}

// This trainer's per-step small collectives (SoftwareProfile::trainer_step_collectives):
// the tp-partial gradients of the slowest stage (the sequence-parallel ones; qk_layernorm's
// two weights per layer whatever the parallelism), the grad norm and the step's loss,
// tokens and skip flag.
double trainer_collectives_time(const Recipe& r, const Layout& l, const Cluster& c) {
  const Shape sh = shape_of(r, l.tp);
  double sp_max = 0;
  const bool sp = l.sequence_parallel && l.tp > 1;
  if (sp || (sh.qk_norm && l.tp > 1)) {
    const GroupLink tpl = group_link(c, 1, l.tp);
    for (int64_t st = 0; st < l.pp; ++st) {
      const double layers = double(l.stage_layers[static_cast<size_t>(st)]);
      // per layer: the two norms' weights (and LayerNorm's biases), the two output biases
      const double per_layer = sp ? double(2 * sh.norm_params() + (sh.bias ? 2 : 0)) : 0.0;
      double t_sp = per_layer * layers * small_allreduce_time(4.0 * double(sh.h), l.tp, tpl);
      if (sh.qk_norm) t_sp += 2 * layers * small_allreduce_time(4.0 * double(sh.D), l.tp, tpl);
      if (sp && st == 0 && !sh.rope) t_sp += allreduce_time(4.0 * double(sh.maxpos) * double(sh.h), l.tp, tpl);
      if (sp && st == l.pp - 1) t_sp += double(sh.norm_params()) * small_allreduce_time(4.0 * double(sh.h), l.tp, tpl);
      sp_max = std::max(sp_max, t_sp);
    }
  }
  double small = 0;
  small += small_allreduce_time(8.0, l.tp * l.pp, group_link(c, 1, l.tp * l.pp));  // grad norm, model parallel
  if (l.distributed_optimizer)
    small += small_allreduce_time(8.0, l.replicas(), group_link(c, l.tp, l.replicas()));  // over the shards
  small += small_allreduce_time(24.0, l.gpus(), group_link(c, 1, l.gpus()));              // loss, tokens, skip flag
  return sp_max + small;
}

IterParts iteration_parts(const Recipe& r, const Layout& l, const Cluster& c_in, const Computed& cs, int64_t batch) {
  const Cluster c = effective(c_in);
  // Ramp batches that do not divide by micro x dp are rounded up to whole microbatches.
  const int64_t unit = l.micro_batch * l.dp;
  const int64_t m = std::max<int64_t>(1, (batch + unit - 1) / unit);
  double slot_max = 0, slot_sum = 0;
  for (auto& s : cs.time) {
    const double slot = s.forward + s.backward + s.p2p;
    slot_max = std::max(slot_max, slot);
    slot_sum += slot;
  }
  const double slot_avg = slot_sum / double(l.pp);
  const double fill = double(l.pp - 1) / double(l.vp);
  IterParts p;
  // Steady state runs at the slowest stage; the fill and drain cost (p-1)/v slots.
  p.pipeline = double(m) * slot_max + fill * slot_avg;
  p.bubble = fill * slot_avg / p.pipeline;
  // Data-parallel gradient reduction after the last backward (not overlapped), the
  // tied-embedding all-reduce between first and last stage, then the optimizer step.
  double dp_max = 0, opt_max = 0;
  for (auto& mem : cs.mem) {
    dp_max = std::max(dp_max, stage_dp_time(r, l, c, mem, cs.time[static_cast<size_t>(mem.stage)], m));
    // Adam over the local shard: read grad, master, m, v; write master, m, v, 16-bit
    // weight (~34 bytes/param) plus a read of the grads for the global norm.
    const double local = mem.params / (l.distributed_optimizer ? double(l.replicas()) : 1.0);
    opt_max = std::max(opt_max, (34.0 * local / c.gpu.hbm_bw + 4.0 * mem.params / c.gpu.hbm_bw) * compute_share(c, l));
  }
  if (l.pp > 1 && !r.model.untie_embeddings_and_output_weights) {  // the tied embedding's two copies
    const Shape sh = shape_of(r, l.tp);
    dp_max += allreduce_time(double(sh.V) * double(sh.h) / double(l.tp) * 4.0, 2, {c.gpu.ib_bw, c.gpu.ib_alpha});
  }
  if (c.software.trainer_step_collectives) dp_max += trainer_collectives_time(r, l, c);
  p.dp = dp_max;
  p.opt = opt_max;
  return p;
}

}  // namespace

double iteration_time(const Recipe& r, const Layout& l, const Cluster& c, int64_t batch) {
  const Computed cs = compute_stages(r, l, c);
  const IterParts p = iteration_parts(r, l, c, cs, batch);
  return p.pipeline + p.dp + p.opt;
}

Estimate estimate(const Recipe& r, const Layout& l, const Cluster& c, const EstimateOptions& o) {
  Estimate est;
  est.layout = l;
  const Computed cs = compute_stages(r, l, c);
  est.stages = cs.mem;
  est.stage_times = cs.time;
  for (auto& m : cs.mem) {
    est.peak_memory = std::max(est.peak_memory, m.total);
    est.allocator_peak = std::max(est.allocator_peak, m.allocator);
  }
  est.fits = est.peak_memory <= c.gpu.memory_bytes;
  const int64_t B = r.training.global_batch_size;
  est.microbatches = B / (l.micro_batch * l.dp);
  const IterParts p = iteration_parts(r, l, c, cs, B);
  est.pipeline_time = p.pipeline;
  est.dp_time = p.dp;
  est.optimizer_time = p.opt;
  est.iteration_time = p.pipeline + p.dp + p.opt;
  est.bubble_fraction = p.bubble;
  const double s = double(r.model.seq_length);
  const int64_t V = r.model.padded_vocab_size(l.tp);
  const double n = double(l.gpus());
  est.tokens_per_s = double(B) * s / est.iteration_time;
  est.tflops_per_gpu = model::hardware_flops(r.model, V, B, l.recompute) / (est.iteration_time * n) / 1e12;
  est.model_tflops_per_gpu = model::model_flops(r.model, V, B) / (est.iteration_time * n) / 1e12;
  est.mfu = est.model_tflops_per_gpu * 1e12 / c.gpu.peak_flops;
  est.hfu = est.tflops_per_gpu * 1e12 / c.gpu.peak_flops;
  est.comm = comm_bytes_per_iteration(r, l, B);
  if (o.with_run) {
    // Walk the batch ramp (schedules/batch_schedule) iteration by iteration until the
    // run length is reached; iterations of equal batch share one time estimate.
    const schedules::RunLength rl = schedules::run_length(r.training, r.model.seq_length);
    std::map<int64_t, double> cache;
    int64_t consumed = 0, iters = 0;
    double secs = 0;
    const int64_t ramp_end = r.training.rampup_batch_size
                                 ? r.training.rampup_batch_size->ramp_tokens / std::max<int64_t>(1, r.model.seq_length)
                                 : 0;
    while (iters < rl.iterations && consumed <= ramp_end) {
      const int64_t b = schedules::global_batch_size(r.training, r.model.seq_length, consumed);
      auto it = cache.find(b);
      if (it == cache.end()) it = cache.emplace(b, iteration_time(r, l, c, b)).first;
      secs += it->second;
      consumed += b;
      ++iters;
    }
    const int64_t rest = rl.iterations - iters;
    secs += double(rest) * est.iteration_time;
    est.run_iterations = rl.iterations;
    est.run_tokens = double(rl.tokens);
    est.run_seconds = secs;
    est.run_tokens_per_s = secs > 0 ? est.run_tokens / secs : 0;
    est.run_gpu_hours = secs / 3600.0 * n;
  }
  return est;
}

}  // namespace mtnlg::cost
