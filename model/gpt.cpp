#include "model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/log.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/moe_ops.hpp"
#include "model/tp_regions.hpp"
#include "core/step_parts.hpp"
#include "parallel/context_parallel.hpp"

namespace mtnlg::model {

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
    case Precision::fp32: break;
  }
  return DType::f32;
}

int64_t logits_chunk_rows(int64_t rows, int64_t vocab_local, int64_t elements) {
  if (rows <= 0) return 1;
  return std::clamp<int64_t>(elements / std::max<int64_t>(vocab_local, 1), 1, rows);
}

namespace {
// An MoE layer's MLP (Megatron-Core's names): the router, its expert bias (a buffer the
// optimizer never moves: its gradient stays zero and it has no weight decay), this rank's
// experts' fc1 then their fc2 (E / ep of them, named by their index among all E), one
// after the other so that each reads as one [E / ep, ...] weight (GptChunk::bind_moe),
// then the shared expert. The router and the shared expert are replicated over tp and
// applied to this rank's rows (MoE layers run under sequence parallelism when tp > 1), so
// their gradients are partial per tp rank; the experts belong to the expert grid
// (ParamInfo::expert) and are reduced over their own replicas.
template <typename Add>
void declare_moe_params(const std::string& p, const GptConfig& c, const Add& add, ParamStore& store) {
  const int64_t C = c.hidden, E = c.moe.num_experts, F = c.moe.ffn, S = c.moe.shared_ffn;
  const int64_t width = c.swiglu ? 2 : 1, first = c.moe.first_expert(), last = first + c.moe.local_experts();
  auto row_param = [&](const std::string& n, Shape shape, InitKind init, bool wd) {
    ParamInfo q = add(p + n, std::move(shape), -1, init, wd);
    q.sp_grad_reduce = true;
    store.add(q);
  };
  // A routed expert's weight, its width (dimension `dim`: fc1's rows, in `parts` parts
  // under SwiGLU, fc2's columns) split over the expert-tensor-parallel ranks.
  const int64_t etp = c.moe.etp_size;
  auto expert = [&](const std::string& n, Shape shape, int64_t dim, int64_t parts, InitKind init) {
    ParamInfo q = add(n, shape, -1, init, true);
    q.expert = true;
    q.tp_replicated = false;
    if (etp > 1) {
      q.split_dim = dim;
      q.split_rank = c.moe.etp_rank;
      q.split_count = etp;
      q.split_parts = parts;
      q.shape[static_cast<size_t>(dim)] /= etp;
    }
    store.add(q);
  };
  row_param("router.weight", {E, C}, InitKind::normal, true);
  if (c.moe.expert_bias) store.add(add(p + "router.expert_bias", {E}, -1, InitKind::zeros, false));
  for (int64_t e = first; e < last; ++e)
    expert(fmt::format("{}experts.local_experts.{}.linear_fc1.weight", p, e), {width * F, C}, 0, width,
           InitKind::normal);
  for (int64_t e = first; e < last; ++e)
    expert(fmt::format("{}experts.local_experts.{}.linear_fc2.weight", p, e), {C, F}, 1, 1,
           InitKind::normal_scaled_output);
  if (S == 0) return;
  row_param("shared_experts.linear_fc1.weight", {width * S, C}, InitKind::normal, true);
  row_param("shared_experts.linear_fc2.weight", {C, S}, InitKind::normal_scaled_output, true);
  if (c.moe.shared_gate) row_param("shared_experts.gate_weight", {1, C}, InitKind::normal, true);
}
}  // namespace

// Parameter names and global shapes (docs/ARCHITECTURE.md "Parameters"): the norms hold
// a bias only as LayerNorms; qkv is [(H + 2G) D, C] in Megatron's per-group layout [q of
// the group's H/G heads | k | v], split by rows so each tp rank holds whole groups; a
// SwiGLU's gate and up are two parameters split alike and declared one after the other,
// so this rank's halves sit next to each other in the store and read as one [2F/tp, C]
// weight; untied, the last stage holds output_layer.weight, vocab-parallel like the
// embedding.
void declare_chunk_params(ParamStore& store, const GptConfig& c, const ChunkSpec& spec, int64_t tp_rank,
                          int64_t tp_size) {
  const int64_t C = c.hidden, V = c.padded_vocab_size, F = c.ffn, QKV = c.qkv_width(), A = c.attention_width();
  auto add = [&](std::string name, Shape global, int64_t split_dim, InitKind init, bool wd) {
    ParamInfo p;
    p.name = std::move(name);
    p.global_shape = global;
    p.shape = global;
    p.split_dim = split_dim;
    p.split_rank = split_dim >= 0 ? tp_rank : 0;
    p.split_count = split_dim >= 0 ? tp_size : 1;
    if (split_dim >= 0) p.shape[split_dim] /= tp_size;
    p.init = init;
    p.weight_decay = wd;
    p.tp_replicated = split_dim < 0;
    return p;
  };
  // Replicated over tp and applied to this rank's rows of the residual stream: under
  // sequence parallelism its gradient is partial per tp rank.
  auto add_row_param = [&](const std::string& name, Shape global, InitKind k, bool wd) {
    auto q = add(name, global, -1, k, wd);
    q.sp_grad_reduce = true;
    store.add(q);
  };
  auto norm = [&](const std::string& n) {
    add_row_param(n + ".weight", {C}, InitKind::ones, false);
    if (!c.rmsnorm) add_row_param(n + ".bias", {C}, InitKind::zeros, false);
  };
  auto word_embedding = [&] {
    auto we = add("embedding.word_embeddings.weight", {V, C}, 0, InitKind::normal, true);
    we.word_embedding = !c.untied;  // shared with the last stage's output layer only when tied
    we.vocab_rows = true;
    store.add(we);
  };
  if (spec.has_embedding) {
    word_embedding();
    if (!c.rope) add_row_param("embedding.position_embeddings.weight", {c.max_positions, C}, InitKind::normal, true);
  }
  for (int64_t l = spec.first_layer; l < spec.first_layer + spec.num_layers; ++l) {
    std::string p = fmt::format("layers.{}.", l);
    norm(p + "input_layernorm");
    store.add(add(p + "attention.qkv.weight", {QKV, C}, 0, InitKind::normal, true));
    if (c.qkv_bias) store.add(add(p + "attention.qkv.bias", {QKV}, 0, InitKind::zeros, false));
    if (c.qk_norm)  // replicated; each tp rank norms its own heads, so the gradients sum over tp
      for (const char* n : {"attention.q_layernorm.weight", "attention.k_layernorm.weight"}) {
        auto q = add(p + n, {c.head_dim()}, -1, InitKind::ones, false);
        q.tp_grad_reduce = true;
        store.add(q);
      }
    store.add(add(p + "attention.proj.weight", {C, A}, 1, InitKind::normal_scaled_output, true));
    if (c.bias_linear) add_row_param(p + "attention.proj.bias", {C}, InitKind::zeros, false);
    norm(p + "post_attention_layernorm");
    if (c.moe.is_moe(l)) {
      declare_moe_params(p + "mlp.", c, add, store);
      continue;
    }
    if (c.swiglu) {
      store.add(add(p + "mlp.fc1_gate.weight", {F, C}, 0, InitKind::normal, true));
      store.add(add(p + "mlp.fc1_up.weight", {F, C}, 0, InitKind::normal, true));
      if (c.bias_linear) {
        store.add(add(p + "mlp.fc1_gate.bias", {F}, 0, InitKind::zeros, false));
        store.add(add(p + "mlp.fc1_up.bias", {F}, 0, InitKind::zeros, false));
      }
    } else {
      store.add(add(p + "mlp.fc1.weight", {F, C}, 0, InitKind::normal, true));
      if (c.bias_linear) store.add(add(p + "mlp.fc1.bias", {F}, 0, InitKind::zeros, false));
    }
    store.add(add(p + "mlp.fc2.weight", {C, F}, 1, InitKind::normal_scaled_output, true));
    if (c.bias_linear) add_row_param(p + "mlp.fc2.bias", {C}, InitKind::zeros, false);
  }
  if (spec.has_head) {
    norm("final_layernorm");
    if (c.untied) {
      auto out = add("output_layer.weight", {V, C}, 0, InitKind::normal, true);
      out.vocab_rows = true;
      store.add(out);
    } else if (!spec.has_embedding)  // the last stage's copy of the tied word embedding
      word_embedding();
  }
}

// Activations a layer saves for its backward (what is kept depends on recompute).
struct GptChunk::LayerActs {
  Tensor x_in;  // [R, C] layer input (always kept)
  Tensor ln1, mean1, rstd1, ln1_full;
  Tensor qkv, att, lse;     // attention output and its log-sum-exp (wide, flash form)
  Tensor qkv_pre, qk_rstd;  // qk_norm: qkv before the norms and their statistics (wide)
  Tensor probs;             // [B, H/tp, T, T] softmax probabilities (unfused form)
  Tensor x2;                // residual after attention [R, C]
  Tensor ln2, mean2, rstd2, ln2_full;
  Tensor fc1, gel;
  MoeActs moe;  // an MoE layer's MLP
  bool filled = false;
};

struct GptChunk::Saved {
  Saved(int64_t micro_batch, size_t num_layers) : layers(num_layers), mbs(micro_batch) {}
  std::vector<LayerActs> layers;
  Tensor tokens, targets;         // i32 [N]
  ops::EmbeddingGradOrder order;  // rows grouped by token (CUDA first stage, training)
  Tensor dloss, mask;             // loss gradient and mask per token (last stage, training; PlacedInputs)
  Tensor keys;                    // CUDA: the placed (step key, first sample) the pass's keys_dev points at
  Pass pass;                      // the forward's call, for the backward (its dropout keys)
  Tensor x_out;                   // chunk output before the head [R, C]
  Tensor lnf, meanf, rstdf;       // the final LayerNorm (its output only until head_loss has used it)
  Tensor dlnf_full;               // the gradient of its (tp-gathered) output [N, C], from head_loss
  int64_t mbs = 0;
  int64_t bytes() const {
    int64_t b = 0;
    auto add = [&](const Tensor& t) {
      if (t.defined()) b += t.nbytes();
    };
    for (auto& l : layers) {
      for (auto* t : {&l.x_in, &l.ln1, &l.mean1, &l.rstd1, &l.qkv, &l.qkv_pre, &l.qk_rstd, &l.att, &l.lse, &l.probs,
                      &l.x2, &l.ln2, &l.mean2, &l.rstd2, &l.fc1, &l.gel})
        add(*t);
      b += l.moe.bytes();
      if (l.ln1_full.defined() && l.ln1_full.raw() != l.ln1.raw()) add(l.ln1_full);
      if (l.ln2_full.defined() && l.ln2_full.raw() != l.ln2.raw()) add(l.ln2_full);
    }
    for (auto* t : {&tokens, &targets, &x_out, &lnf, &meanf, &rstdf, &dlnf_full}) add(*t);
    return b;
  }
};

GptChunk::GptChunk(const GptConfig& cfg, ChunkSpec spec, ParamStore& store, const parallel::ProcessGroups& groups)
    : cfg_(cfg), spec_(std::move(spec)), store_(store), groups_(groups) {
  dev_ = store.weights().defined() ? store.weights().device() : Device::cpu;  // placement: where the weights live
  MTNLG_CHECK(store.weights().defined() && store.compute_dtype() == cfg.dtype,
              "GptChunk: the parameter store's compute copy is {}, the model computes in {}",
              store.weights().defined() ? to_string(store.compute_dtype()) : "missing", to_string(cfg.dtype));
  tp_ = groups.tp ? groups.tp->size() : 1;
  tp_rank_ = groups.tp ? groups.tp->rank() : 0;
  heads_local_ = cfg.heads / tp_;
  groups_local_ = cfg.kv_groups() / tp_;
  cp_ = groups.cp ? groups.cp->size() : 1;
  cp_rank_ = groups.cp ? groups.cp->rank() : 0;
  if (cp_ > 1) {
    if (cfg.attention == AttentionBackend::unfused)
      throw_input(
          "model.attention_backend: unfused does not run across context-parallel ranks (they merge the "
          "flash form's log-sum-exp); use flash or auto");
    cp_pos_ = parallel::cp_positions(cfg.seq_length, cp_, cp_rank_);
    cp_ex_ = parallel::make_cp_exchange(groups.cp);
  } else {
    cp_pos_.resize(static_cast<size_t>(cfg.seq_length));
    for (int64_t t = 0; t < cfg.seq_length; ++t) cp_pos_[static_cast<size_t>(t)] = t;
  }
  norm_ = Norm{cfg.rmsnorm, cfg.layernorm_eps};
  mlp_ = Mlp{cfg.swiglu};
  setup_moe();
  rotary_ = Rotary{cfg.rope, cfg.rope_params};
  qk_norm_ = QkNorm{cfg.qk_norm, cfg.layernorm_eps};
  resolve_attention();
  ffn_local_ = cfg.ffn / tp_;
  vocab_local_ = cfg.padded_vocab_size / tp_;
  vocab_start_ = tp_rank_ * vocab_local_;
  vocab_valid_ = std::clamp<int64_t>(cfg.vocab_size - vocab_start_, 0, vocab_local_);
  for (int64_t l = spec_.first_layer; l < spec_.first_layer + spec_.num_layers; ++l) bind_layer(l);
  auto offset = [&](const std::string& n) { return store.info(n).offset; };
  if (spec_.has_embedding || (spec_.has_head && !cfg.untied)) {
    wte_ = store.weight("embedding.word_embeddings.weight");
    d_wte_ = store.grad("embedding.word_embeddings.weight");
  }
  if (spec_.has_embedding) {
    // The word embedding's gradient is final only after the lookup's backward, which
    // comes last even when this chunk also holds the tied output layer.
    if (!cfg.rope) {
      wpe_ = store.weight("embedding.position_embeddings.weight");
      d_wpe_ = store.grad("embedding.position_embeddings.weight");
      embedding_param_offsets_.push_back(offset("embedding.position_embeddings.weight"));
    }
    embedding_param_offsets_.push_back(offset("embedding.word_embeddings.weight"));
  }
  if (spec_.has_head) {
    lnf_w_ = store.weight("final_layernorm.weight");
    d_lnf_w_ = store.grad("final_layernorm.weight");
    head_param_offsets_ = {offset("final_layernorm.weight")};
    if (!cfg.rmsnorm) {
      lnf_b_ = store.weight("final_layernorm.bias");
      d_lnf_b_ = store.grad("final_layernorm.bias");
      head_param_offsets_.push_back(offset("final_layernorm.bias"));
    }
    if (cfg.untied) {
      out_w_ = store.weight("output_layer.weight");
      d_out_w_ = store.grad("output_layer.weight");
      head_param_offsets_.push_back(offset("output_layer.weight"));
    } else {
      out_w_ = wte_;
      d_out_w_ = d_wte_;
      if (!spec_.has_embedding) head_param_offsets_.push_back(offset("embedding.word_embeddings.weight"));
    }
  }
}

// Binds layer `layer`'s weights and gradients (those the store declares) and records
// their offsets for the gradient-ready hook. A SwiGLU's gate and up are declared one after
// the other (declare_chunk_params), so this rank's halves read as one [2F/tp, C] weight.
void GptChunk::bind_layer(int64_t layer) {
  const std::string p = fmt::format("layers.{}.", layer);
  LayerParams lp;
  std::vector<int64_t> offsets;
  auto bind = [&](Tensor& w, Tensor& g, const std::string& n) {
    if (!store_.has(p + n)) return;
    w = store_.weight(p + n);
    g = store_.grad(p + n);
    offsets.push_back(store_.info(p + n).offset);
  };
  // gate and up as one: the gate's offset, both parameters' elements
  auto bind_pair = [&](Tensor& w, Tensor& g, const std::string& gate, const std::string& up) {
    if (!store_.has(p + gate)) return;
    const ParamInfo& a = store_.info(p + gate);
    const ParamInfo& b = store_.info(p + up);
    MTNLG_CHECK(b.offset == a.offset + a.numel && b.shape == a.shape, "{}{} and {} must be adjacent halves", p, gate,
                up);
    Shape both = a.shape;
    both[0] *= 2;
    w = store_.weights().flat(a.offset, 2 * a.numel).view(both);
    g = store_.grads().flat(a.offset, 2 * a.numel).view(both);
    offsets.push_back(a.offset);
    offsets.push_back(b.offset);
  };
  bind(lp.ln1_w, lp.d_ln1_w, "input_layernorm.weight");
  bind(lp.ln1_b, lp.d_ln1_b, "input_layernorm.bias");
  bind(lp.qkv_w, lp.d_qkv_w, "attention.qkv.weight");
  bind(lp.qkv_b, lp.d_qkv_b, "attention.qkv.bias");
  bind(lp.q_norm_w, lp.d_q_norm_w, "attention.q_layernorm.weight");
  bind(lp.k_norm_w, lp.d_k_norm_w, "attention.k_layernorm.weight");
  bind(lp.proj_w, lp.d_proj_w, "attention.proj.weight");
  bind(lp.proj_b, lp.d_proj_b, "attention.proj.bias");
  bind(lp.ln2_w, lp.d_ln2_w, "post_attention_layernorm.weight");
  bind(lp.ln2_b, lp.d_ln2_b, "post_attention_layernorm.bias");
  if (cfg_.moe.is_moe(layer)) {
    bind_moe(lp, p + "mlp.", offsets);
  } else if (cfg_.swiglu) {
    bind_pair(lp.fc1_w, lp.d_fc1_w, "mlp.fc1_gate.weight", "mlp.fc1_up.weight");
    bind_pair(lp.fc1_b, lp.d_fc1_b, "mlp.fc1_gate.bias", "mlp.fc1_up.bias");
  } else {
    bind(lp.fc1_w, lp.d_fc1_w, "mlp.fc1.weight");
    bind(lp.fc1_b, lp.d_fc1_b, "mlp.fc1.bias");
  }
  bind(lp.fc2_w, lp.d_fc2_w, "mlp.fc2.weight");
  bind(lp.fc2_b, lp.d_fc2_b, "mlp.fc2.bias");
  MTNLG_CHECK(lp.qkv_w.defined() && ((lp.fc1_w.defined() && lp.fc2_w.defined()) || lp.moe),
              "layer {}: parameters missing from the store", layer);
  moe_stat_index_.push_back(lp.moe ? static_cast<int64_t>(moe_stats_.size()) : -1);
  if (lp.moe) moe_stats_.push_back(MoeLayerStats{layer, {}, 0, 0.0, 0.0, 0});
  layers_.push_back(lp);
  layer_param_offsets_.push_back(std::move(offsets));
}

// An MoE layer's weights: the experts' fc1 (and fc2) are E adjacent parameters of one
// shape (declare_chunk_params), read as one [E, ...] weight and gradient.
void GptChunk::bind_moe(LayerParams& lp, const std::string& p, std::vector<int64_t>& offsets) {
  const int64_t E = cfg_.moe.local_experts();
  auto bind = [&](Tensor& w, Tensor* g, const std::string& n) {
    if (!store_.has(p + n)) return;
    w = store_.weight(p + n);
    if (g) *g = store_.grad(p + n);
    offsets.push_back(store_.info(p + n).offset);
  };
  auto bind_stack = [&](Tensor& w, Tensor& g, const char* fc) {
    const int64_t e0 = cfg_.moe.first_expert();
    const ParamInfo& first = store_.info(fmt::format("{}experts.local_experts.{}.{}.weight", p, e0, fc));
    for (int64_t e = 0; e < E; ++e) {
      const ParamInfo& i = store_.info(fmt::format("{}experts.local_experts.{}.{}.weight", p, e0 + e, fc));
      MTNLG_CHECK(i.offset == first.offset + e * first.numel && i.shape == first.shape,
                  "{}experts: the experts' {} weights must be adjacent and of one shape", p, fc);
      offsets.push_back(i.offset);
    }
    const Shape s{E, first.shape[0], first.shape[1]};
    w = store_.weights().flat(first.offset, E * first.numel).view(s);
    g = store_.grads().flat(first.offset, E * first.numel).view(s);
  };
  lp.moe = true;
  bind(lp.moe_p.router_w, &lp.moe_p.d_router_w, "router.weight");
  // The expert bias is read in fp32 from the master weights (Megatron-Core keeps it an
  // fp32 buffer): its sign-rule steps are far below bf16's resolution.
  if (store_.has(p + "router.expert_bias")) {
    lp.moe_p.expert_bias = store_.param(p + "router.expert_bias");
    offsets.push_back(store_.info(p + "router.expert_bias").offset);
  }
  bind_stack(lp.moe_p.w1, lp.moe_p.d_w1, "linear_fc1");
  bind_stack(lp.moe_p.w2, lp.moe_p.d_w2, "linear_fc2");
  bind(lp.moe_p.s_w1, &lp.moe_p.d_s_w1, "shared_experts.linear_fc1.weight");
  bind(lp.moe_p.s_w2, &lp.moe_p.d_s_w2, "shared_experts.linear_fc2.weight");
  bind(lp.moe_p.s_gate, &lp.moe_p.d_s_gate, "shared_experts.gate_weight");
}

void GptChunk::reset_moe_stats() {
  for (auto& st : moe_stats_) st.reset();
}

// b_e += rate * sign(mean(c) - c_e) from the step's routed counts (after drops), on the
// master weights and their compute copy.
void GptChunk::update_expert_bias() {
  for (size_t li = 0; li < layers_.size(); ++li) {
    const int64_t si = moe_stat_index_[li];
    if (si < 0 || !layers_[li].moe_p.expert_bias.defined()) continue;
    const MoeLayerStats& st = moe_stats_[static_cast<size_t>(si)];
    if (st.tokens.empty()) continue;
    const std::string name = fmt::format("layers.{}.mlp.router.expert_bias", st.layer);
    Tensor master = store_.param(name);
    // The counts (integers, exact in f32) beside the master bias, in its dtype.
    Tensor counts = Tensor::empty({cfg_.moe.num_experts}, master.dtype(), Device::cpu);
    for (int64_t e = 0; e < cfg_.moe.num_experts; ++e) {
      const double c = st.tokens[static_cast<size_t>(e)];
      if (master.dtype() == DType::f64)
        counts.data<double>()[e] = c;
      else
        counts.data<float>()[e] = static_cast<float>(c);
    }
    counts = counts.on(master.device());
    ops::moe_expert_bias_update(master, counts, cfg_.moe.bias_update_rate);
    if (store_.has_compute_copy()) {
      Tensor w = store_.weight(name);
      ops::convert(w, master);
    }
  }
}

// The MoE MLP and the groups it talks over: the expert-parallel group, and under
// sequence parallelism the tp group (each tp rank routes its own rows).
void GptChunk::setup_moe() {
  moe_ = MoeMlp{cfg_.moe, cfg_.swiglu};
  if (!cfg_.moe.enabled()) return;
  // Training routes each tp rank's own rows; inference (no expert grid) runs every MoE
  // layer whole on every tp rank.
  if (tp_ > 1 && !cfg_.sequence_parallel && groups_.edp)
    throw_input(
        "parallel.sequence_parallel: MoE layers with tensor_model_parallel_size {} need sequence parallelism (each "
        "tp rank routes its own tokens); set parallel.sequence_parallel: true",
        tp_);
  const int64_t ep = groups_.ep ? groups_.ep->size() : 1, etp = groups_.etp ? groups_.etp->size() : 1;
  MTNLG_CHECK(cfg_.moe.ep_size == ep && cfg_.moe.etp_size == etp,
              "MoE: the model declares experts for ep {} x etp {} ranks, the groups have {} x {}", cfg_.moe.ep_size,
              cfg_.moe.etp_size, ep, etp);
  moe_.groups.ep = groups_.ep.get();
  moe_.groups.etp = groups_.etp.get();
  if (cfg_.sequence_parallel && tp_ > 1) moe_.groups.seq.push_back(groups_.tp.get());
  if (cp_ > 1) moe_.groups.seq.push_back(groups_.cp.get());  // each cp rank routes its own positions
  if (groups_.dp && groups_.dp->size() > 1) moe_.groups.dp = groups_.dp.get();
}

GptChunk::~GptChunk() = default;

void GptChunk::drop_saved() { saved_.clear(); }

int64_t GptChunk::local_rows(int64_t mbs, int64_t seq_len) const {
  int64_t n = mbs * (seq_len > 0 ? seq_len : call_seq());
  return cfg_.sequence_parallel ? n / tp_ : n;
}

KvCache GptChunk::make_kv_cache(int64_t batch, int64_t capacity) const {
  MTNLG_CHECK(batch > 0 && capacity > 0, "a KV cache needs batch > 0 and capacity > 0, got {} and {}", batch, capacity);
  KvCache c;
  c.batch = batch;
  c.capacity = capacity;
  const int64_t D = cfg_.head_dim();
  for (size_t l = 0; l < layers_.size(); ++l) {
    // empty + fill, not Tensor::zeros: zeros is host-only (a CUDA tensor is filled on its stream)
    for (auto* list : {&c.k, &c.v}) {
      list->push_back(Tensor::empty({batch, groups_local_, capacity, D}, cfg_.dtype, dev_));
      ops::fill(list->back(), 0.0);
    }
  }
  return c;
}

int64_t GptChunk::saved_bytes() const {
  int64_t b = 0;
  for (auto& [k, s] : saved_) b += s->bytes();
  return b;
}

namespace {
enum Site : int64_t { kEmbedding = 0, kAttention = 1, kAttnOut = 2, kMlpOut = 3, kMoeJitter = 4 };
}

// key = mix_key(step key, layer + 1, site), base = sample_offset * per_sample + add.
GptChunk::DropSite GptChunk::drop_site(const Pass& p, int64_t layer, int64_t site, uint64_t per_sample,
                                       uint64_t add) const {
  const DeviceKey k{p.keys_dev, static_cast<uint64_t>(layer + 1), static_cast<uint64_t>(site), per_sample, add};
  return {k.derive_key(p.step_key), k.derive_offset(static_cast<uint64_t>(p.sample_offset)), k};
}

GptChunk::DropSite GptChunk::hidden_drop(const Pass& p, int64_t layer, int64_t site, int64_t local_rows) const {
  // Mask element (global row, column): sample_offset * T * C + row * C + column, with this
  // rank's first global row (sequence parallelism shards rows over tp).
  // Under context parallelism the rows of cp rank r take the micro batch's mask rows
  // [r B L, (r + 1) B L): every element still has a draw of its own, but not the one it
  // has in a run without cp (the rows are not contiguous positions).
  const int64_t row_start = (cfg_.sequence_parallel ? tp_rank_ * local_rows : 0) + (p.cp ? cp_rank_ * p.tokens() : 0);
  return drop_site(p, layer, site, static_cast<uint64_t>(cfg_.seq_length * cfg_.hidden),
                   static_cast<uint64_t>(row_start * cfg_.hidden));
}

ops::AttentionDropout GptChunk::attention_dropout(const Pass& p, int64_t layer) const {
  const DropSite d = drop_site(p, layer, kAttention, 1, 0);  // its base: the first sample
  return {cfg_.attention_dropout, d.key, static_cast<int64_t>(d.base), tp_rank_ * heads_local_, cfg_.heads, d.dkey};
}

GptChunk::NextNorm GptChunk::next_norm(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& w, const Tensor& b,
                                       int64_t rows) const {
  out = Tensor::empty({rows, cfg_.hidden}, cfg_.dtype, dev_);
  norm_.stats(mean, rstd, rows, stats_dtype(), dev_);
  return {&out, &mean, &rstd, &w, &b};
}

namespace {
const Tensor* bias_of(const Tensor& b) { return b.defined() ? &b : nullptr; }
}  // namespace

void GptChunk::layer_forward(int64_t li, const Tensor& x, Tensor& y, LayerActs& a, const Pass& pass,
                             const NextNorm* next) {
  auto& p = layers_[li];
  const int64_t layer = spec_.first_layer + li;
  const int64_t C = cfg_.hidden, T = pass.seq, B = pass.batch, N = B * T, R = x.dim(0);
  const int64_t D = cfg_.head_dim(), A = heads_local_ * D;
  const DType dt = x.dtype(), wide = stats_dtype();
  const bool sp = cfg_.sequence_parallel;
  auto* tpc = groups_.tp.get();
  a.x_in = x;
  if (!a.ln1.defined()) {  // else the previous layer's last residual add computed it
    a.ln1 = Tensor::empty({R, C}, dt, dev_);
    norm_.stats(a.mean1, a.rstd1, R, wide, dev_);
    norm_.forward(a.ln1, a.mean1, a.rstd1, x, p.ln1_w, p.ln1_b);
  }
  a.ln1_full = tp::enter_column_parallel_forward(tpc, sp, a.ln1);
  a.qkv = Tensor::empty({B, T, (heads_local_ + 2 * groups_local_) * D}, dt, dev_);
  ops::matmul_forward(a.qkv, a.ln1_full, p.qkv_w, bias_of(p.qkv_b));
  qk_norm_.forward(a.qkv, a.qkv_pre, a.qk_rstd, p.q_norm_w, p.k_norm_w, heads_local_, groups_local_,
                   pass.purpose == Purpose::train, wide);
  rotate(a.qkv, pass, false);
  a.att = Tensor::empty({N, A}, dt, dev_);
  if (pass.kv) {  // over the cached positions too; appends this call's keys and values
    ops::attention_cached_forward(a.att, pass.kv->k[static_cast<size_t>(li)], pass.kv->v[static_cast<size_t>(li)],
                                  a.qkv, heads_local_, pass.kv->length, groups_local_);
  } else {
    attention_core_forward(a, pass, layer);
  }
  Tensor proj_partial = Tensor::empty({N, C}, dt, dev_);
  ops::matmul_forward(proj_partial, a.att, p.proj_w, nullptr);
  Tensor proj = tp::leave_row_parallel_forward(tpc, sp, proj_partial);
  // x2 = x + dropout(proj + b), the residual stream after attention, and its norm: one op
  const DropSite attn_drop = hidden_drop(pass, layer, kAttnOut, R);
  const ops::ResidualBranch attn_out{bias_of(p.proj_b), cfg_.hidden_dropout, attn_drop.key, attn_drop.base,
                                     attn_drop.dkey};
  a.x2 = Tensor::empty({R, C}, dt, dev_);
  a.ln2 = Tensor::empty({R, C}, dt, dev_);
  norm_.stats(a.mean2, a.rstd2, R, wide, dev_);
  norm_.residual_forward(a.x2, a.ln2, a.mean2, a.rstd2, x, proj, attn_out, p.ln2_w, p.ln2_b);
  // An MoE layer routes this rank's rows (sequence parallelism) as they are.
  a.ln2_full = p.moe ? a.ln2 : tp::enter_column_parallel_forward(tpc, sp, a.ln2);
  Tensor fc2 = mlp_forward(li, a, pass);
  // y = x2 + dropout(fc2 + b), with the norm that reads y when there is one: one op
  const DropSite mlp_drop = hidden_drop(pass, layer, kMlpOut, R);
  const ops::ResidualBranch mlp_out{bias_of(p.fc2_b), cfg_.hidden_dropout, mlp_drop.key, mlp_drop.base, mlp_drop.dkey};
  y = Tensor::empty({R, C}, dt, dev_);
  if (next)
    norm_.residual_forward(y, *next->out, *next->mean, *next->rstd, a.x2, fc2, mlp_out, *next->w, *next->b);
  else
    ops::residual_add_forward(y, a.x2, fc2, mlp_out);
  a.filled = true;
}

Tensor GptChunk::mlp_forward(int64_t li, LayerActs& a, const Pass& pass) {
  auto& p = layers_[li];
  const int64_t C = cfg_.hidden, N = pass.tokens();
  const DType dt = a.ln2_full.dtype();
  if (p.moe) {  // this rank's rows in and out: nothing to reduce over tp
    Tensor out = Tensor::empty({a.ln2_full.dim(0), C}, dt, dev_);
    const bool train = pass.purpose == Purpose::train;
    const int64_t si = moe_stat_index_[static_cast<size_t>(li)];
    MoeLayerStats* st = train && !recomputing_ ? &moe_stats_[static_cast<size_t>(si)] : nullptr;
    a.moe.jitter.on = train && cfg_.moe.jitter_eps > 0;
    if (a.moe.jitter.on) {  // drawn like hidden dropout over this rank's rows (the recompute draws the same)
      const DropSite d = hidden_drop(pass, spec_.first_layer + li, kMoeJitter, a.ln2_full.dim(0));
      a.moe.jitter.key = d.key, a.moe.jitter.base = d.base, a.moe.jitter.dkey = d.dkey;
    }
    moe_.forward(out, a.moe, a.ln2_full, p.moe_p, pass.seq, train, st);
    return out;
  }
  a.fc1 = Tensor::empty({N, mlp_.pre_width(ffn_local_)}, dt, dev_);
  a.gel = Tensor::empty({N, ffn_local_}, dt, dev_);
  mlp_.forward(a.gel, a.fc1, a.ln2_full, p.fc1_w, bias_of(p.fc1_b));
  Tensor fc2_partial = Tensor::empty({N, C}, dt, dev_);
  ops::matmul_forward(fc2_partial, a.gel, p.fc2_w, nullptr);
  return tp::leave_row_parallel_forward(groups_.tp.get(), cfg_.sequence_parallel, fc2_partial);
}

Tensor GptChunk::mlp_backward(int64_t li, const Tensor& dfc2, LayerActs& a, const Pass& pass) {
  auto& p = layers_[li];
  const int64_t C = cfg_.hidden, N = pass.tokens();
  const bool sp = cfg_.sequence_parallel;
  auto* tpc = groups_.tp.get();
  if (p.moe) {  // this rank's rows (the forward's)
    Tensor dln2 = Tensor::empty(dfc2.shape(), dfc2.dtype(), dev_);
    // the MoE losses' weight from device memory (take_placed checked it is there)
    moe_.backward(dln2, dfc2, a.moe, a.ln2_full, p.moe_p, pass.seq, 1.0, &pass.moe_dloss);
    return dln2;
  }
  Tensor dfc2_full = tp::leave_row_parallel_backward(tpc, sp, dfc2);
  Tensor dln2_full = Tensor::empty({N, C}, dfc2.dtype(), dev_);
  ops::matmul_backward(nullptr, &p.d_fc2_w, nullptr, dfc2_full, a.gel, p.fc2_w);
  // through fc2's input and the activation (with fc1's bias grad)
  Tensor dfc1 = Tensor::empty(a.fc1.shape(), dfc2.dtype(), dev_);
  mlp_.backward(dfc1, p.fc1_b.defined() ? &p.d_fc1_b : nullptr, dfc2_full, p.fc2_w, a.fc1);
  ops::matmul_backward(&dln2_full, &p.d_fc1_w, nullptr, dfc1, a.ln2_full, p.fc1_w);
  return tp::enter_column_parallel_backward(tpc, sp, dln2_full);
}

void GptChunk::layer_backward(int64_t li, const Tensor& dy, Tensor& dx, LayerActs& a, const Pass& pass) {
  auto& p = layers_[li];
  const int64_t layer = spec_.first_layer + li;
  const int64_t C = cfg_.hidden, T = pass.seq, B = pass.batch, N = B * T, R = dy.dim(0);
  const int64_t A = heads_local_ * cfg_.head_dim();
  const DType dt = dy.dtype();
  const bool sp = cfg_.sequence_parallel;
  auto* tpc = groups_.tp.get();
  // MLP branch: y = x2 + dropout(fc2(act(fc1(norm2(x2)))) + b)
  Tensor dfc2 = hidden_dropout_grad(dy, pass, layer, kMlpOut);
  if (p.fc2_b.defined()) ops::bias_add_backward(p.d_fc2_b, dfc2);
  Tensor dln2 = mlp_backward(li, dfc2, a, pass);
  Tensor dx2 = Tensor::empty({R, C}, dt, dev_);  // dy (the residual) + norm2's backward, one op
  norm_.residual_backward(dx2, p.d_ln2_w, p.d_ln2_b, dy, dln2, a.x2, p.ln2_w, a.mean2, a.rstd2);

  // Attention branch: x2 = x + dropout(proj(attn(rope(qk_norm(qkv(norm1(x)))))) + b)
  // (dproj may be dx2 itself: every read of it comes before dx2 accumulates in place below)
  Tensor dproj = hidden_dropout_grad(dx2, pass, layer, kAttnOut);
  if (p.proj_b.defined()) ops::bias_add_backward(p.d_proj_b, dproj);
  Tensor dproj_full = tp::leave_row_parallel_backward(tpc, sp, dproj);
  Tensor datt = Tensor::empty({N, A}, dt, dev_);
  ops::matmul_backward(&datt, &p.d_proj_w, nullptr, dproj_full, a.att, p.proj_w);
  Tensor dqkv = attention_core_backward(datt.view({B, T, A}), a, pass, layer);
  rotate(dqkv, pass, true);
  qk_norm_.backward(dqkv, p.d_q_norm_w, p.d_k_norm_w, a.qkv_pre, a.qk_rstd, p.q_norm_w, p.k_norm_w, heads_local_,
                    groups_local_);
  Tensor dln1_full = Tensor::empty({N, C}, dt, dev_);
  ops::matmul_backward(&dln1_full, &p.d_qkv_w, p.qkv_b.defined() ? &p.d_qkv_b : nullptr, dqkv, a.ln1_full, p.qkv_w);
  Tensor dln1 = tp::enter_column_parallel_backward(tpc, sp, dln1_full);
  dx = dx2;  // dx2 (the residual) + norm1's backward, in place
  norm_.residual_backward(dx, p.d_ln1_w, p.d_ln1_b, dx2, dln1, a.x_in, p.ln1_w, a.mean1, a.rstd1);
}

// model.attention_backend on this chunk's device. auto: flash on the CPU and the test
// device; on CUDA flash (cuDNN's fused attention) where cuDNN takes this problem, else
// unfused. flash on CUDA that cuDNN refuses is the recipe's error.
void GptChunk::resolve_attention() {
  if (cp_ > 1) {  // the flash form's blocks across the cp group (checked in the constructor)
    attention_ = AttentionBackend::flash;
    std::string why;
    const bool fused = cp_fused_for_call(std::max<int64_t>(cfg_.micro_batch_size, 1), cfg_.seq_length / cp_,
                                         cfg_.attention_dropout, &why);
    attention_note_ = fmt::format("flash, across {} context-parallel ranks ({}, {})", cp_, to_string(cfg_.cp_comm),
                                  fused ? "cuDNN's fused blocks" : "blocks in f32: " + why);
    return;
  }
  std::string why;
  const bool flash_runs =
      cfg_.attention != AttentionBackend::unfused &&
      ops::attention_lse_supported(dev_, cfg_.dtype, std::max<int64_t>(cfg_.micro_batch_size, 1), cfg_.seq_length,
                                   heads_local_, cfg_.head_dim(), cfg_.attention_dropout, &why, groups_local_);
  switch (cfg_.attention) {
    case AttentionBackend::unfused:
      attention_ = AttentionBackend::unfused;
      attention_note_ = "unfused";
      return;
    case AttentionBackend::flash:
      if (!flash_runs) throw_input("model.attention_backend: flash does not run here ({}); use unfused or auto", why);
      attention_ = AttentionBackend::flash;
      break;
    case AttentionBackend::automatic:
      attention_ = flash_runs ? AttentionBackend::flash : AttentionBackend::unfused;
      break;
  }
  attention_note_ =
      attention_ == AttentionBackend::flash ? fmt::format("flash ({})", why) : fmt::format("unfused (flash: {})", why);
}

// The gradient through a hidden-dropout site: `g` itself at p = 0 (no copy), else the
// masked and rescaled copy.
Tensor GptChunk::hidden_dropout_grad(const Tensor& g, const Pass& p, int64_t layer, int64_t site) const {
  if (cfg_.hidden_dropout <= 0) return g;
  Tensor d = Tensor::empty(g.shape(), g.dtype(), dev_);
  const DropSite drop = hidden_drop(p, layer, site, g.dim(0));
  ops::dropout_backward(d, g, cfg_.hidden_dropout, drop.key, drop.base, drop.dkey);
  return d;
}

// The attention core, att = softmax(mask(Q K^T / sqrt(d))) V, in the chunk's form. Flash
// keeps the rows' log-sum-exp and its backward recomputes the probabilities, so
// "selective" recompute costs nothing extra there. Unfused keeps the [B, H/tp, T, T]
// probabilities, except under selective recompute, where the backward redoes the core's
// forward (Megatron's selective recompute: Korthikanti et al. 2022, Section 5).
//
// On CUDA the flash form is cuDNN's, planned per shape: the training shape is planned when
// the chunk is built; a call of another shape that cuDNN does not take runs unfused (with
// a warning, once), and inference calls (eval's batched scoring: a new length per batch,
// generation: one token at a time; nothing kept for a backward) run unfused rather than
// plan every length. The backward follows the form its forward took (a.lse or a.probs).
bool GptChunk::flash_for_call(const Pass& p) const {
  if (attention_ != AttentionBackend::flash) return false;
  if (dev_ != Device::cuda) return true;
  if (p.purpose == Purpose::infer) return false;
  const int64_t B = p.batch, T = p.seq;
  // Per layer and micro batch: the answer only (the plans are cached); the reason is
  // asked for once cuDNN has refused.
  auto supported = [&](std::string* why) {
    return ops::attention_lse_supported(dev_, cfg_.dtype, B, T, heads_local_, cfg_.head_dim(), cfg_.attention_dropout,
                                        why, groups_local_);
  };
  if (supported(nullptr)) return true;
  std::string why;
  supported(&why);
  static std::once_flag warned;
  std::call_once(warned, [&] { log::warn("attention: a call of shape B {} T {} runs unfused ({})", B, T, why); });
  return false;
}

// Context parallelism's blocks in cuDNN's fused form (docs/specs/cudnn-sdpa.md, "Blocks"):
// on CUDA, bf16/fp16, p2p or all_gather (model.attention_backend is flash or auto with cp), no
// attention dropout, and cuDNN planning the ring's blocks of B samples of L local rows (the plans
// are cached); otherwise the blocks run unfused in f32. `why` says what refused it.
bool GptChunk::cp_fused_for_call(int64_t B, int64_t L, double dropout_p, std::string* why) const {
  std::string no;
  if (dev_ != Device::cuda)
    no = "not on CUDA";
  else if (cfg_.dtype != DType::bf16 && cfg_.dtype != DType::f16)
    no = "the activations are " + to_string(cfg_.dtype);
  else if (cfg_.cp_comm != CpCommType::p2p && cfg_.cp_comm != CpCommType::all_gather)
    no = "cuDNN's blocks take p2p or all_gather";
  else if (dropout_p > 0)
    no = "attention dropout";
  if (!no.empty()) {
    if (why) *why = no;
    return false;
  }
  return ops::attention_cp_blocks_fused_supported(dev_, cfg_.dtype, B, L, heads_local_, cfg_.head_dim(), why,
                                                  groups_local_, cfg_.cp_comm == CpCommType::all_gather ? cp_ : 0);
}

void GptChunk::attention_core_forward(LayerActs& a, const Pass& p, int64_t layer) {
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1);
  if (p.cp && cp_fused_for_call(B, T, attention_dropout(p, layer).p)) {  // bf16/fp16 kept, lse f32
    a.lse = Tensor::empty({B, heads_local_, T}, DType::f32, dev_);
    parallel::CpAttention at{heads_local_, groups_local_, cfg_.cp_comm, {}, cfg_.cp_a2a_size};
    at.fused = true;
    Tensor out = a.att.view({B, T, heads_local_ * cfg_.head_dim()});
    parallel::cp_attention_forward(out, a.lse, a.qkv, at, *cp_ex_);
    return;
  }
  if (p.cp) {  // across the cp group, in f32 for bf16/fp16 (what the one-rank CPU op computes in)
    const bool wide = a.qkv.dtype() == DType::f32 || a.qkv.dtype() == DType::f64;
    const DType w = wide ? a.qkv.dtype() : DType::f32;
    Tensor qkv = a.qkv, out = a.att.view({B, T, heads_local_ * cfg_.head_dim()});
    if (!wide) {
      qkv = Tensor::empty(a.qkv.shape(), w, dev_);
      ops::convert(qkv, a.qkv);
      out = Tensor::empty(out.shape(), w, dev_);
    }
    a.lse = Tensor::empty({B, heads_local_, T}, stats_dtype(), dev_);
    const parallel::CpAttention at{heads_local_, groups_local_, cfg_.cp_comm, attention_dropout(p, layer),
                                   cfg_.cp_a2a_size};
    parallel::cp_attention_forward(out, a.lse, qkv, at, *cp_ex_);
    if (!wide) ops::convert(a.att, out);
    return;
  }
  if (flash_for_call(p)) {
    a.lse = Tensor::empty({B, heads_local_, T}, stats_dtype(), dev_);
    ops::attention_forward_lse(a.att, a.lse, a.qkv, heads_local_, attention_dropout(p, layer), groups_local_);
    return;
  }
  a.probs = Tensor::empty({B, heads_local_, T, T}, a.qkv.dtype(), dev_);
  ops::attention_forward(a.att, a.probs, a.qkv, heads_local_, attention_dropout(p, layer), groups_local_);
  if (cfg_.recompute == RecomputeGranularity::selective) a.probs = Tensor();
}

Tensor GptChunk::attention_core_backward(const Tensor& datt, LayerActs& a, const Pass& p, int64_t layer) {
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1);
  Tensor dqkv = Tensor::empty(a.qkv.shape(), a.qkv.dtype(), dev_);
  const ops::AttentionDropout drop = attention_dropout(p, layer);
  if (p.cp && cp_fused_for_call(B, T, drop.p)) {  // the forward's fused blocks
    parallel::CpAttention at{heads_local_, groups_local_, cfg_.cp_comm, {}, cfg_.cp_a2a_size};
    at.fused = true;
    parallel::cp_attention_backward(dqkv, datt, a.qkv, a.att.view(datt.shape()), a.lse, at, *cp_ex_);
    return dqkv;
  }
  if (p.cp) {
    const bool wide = a.qkv.dtype() == DType::f32 || a.qkv.dtype() == DType::f64;
    auto widened = [&](const Tensor& x) {
      if (wide) return x;
      Tensor y = Tensor::empty(x.shape(), DType::f32, dev_);
      ops::convert(y, x);
      return y;
    };
    const Tensor qkv = widened(a.qkv), out = widened(a.att.view(datt.shape())), dout = widened(datt);
    Tensor dq = wide ? dqkv : Tensor::empty(dqkv.shape(), DType::f32, dev_);
    const parallel::CpAttention at{heads_local_, groups_local_, cfg_.cp_comm, drop, cfg_.cp_a2a_size};
    parallel::cp_attention_backward(dq, dout, qkv, out, a.lse, at, *cp_ex_);
    if (!wide) ops::convert(dqkv, dq);
    return dqkv;
  }
  if (a.lse.defined()) {  // the forward took the flash form
    ops::attention_backward_lse(dqkv, datt, a.qkv, a.att.view(datt.shape()), a.lse, heads_local_, drop, groups_local_);
    return dqkv;
  }
  Tensor probs = a.probs;
  if (!probs.defined()) {  // selective recompute: redo the core's forward
    probs = Tensor::empty({B, heads_local_, T, T}, a.qkv.dtype(), dev_);
    Tensor scratch = Tensor::empty(a.att.shape(), a.att.dtype(), dev_);
    ops::attention_forward(scratch, probs, a.qkv, heads_local_, drop, groups_local_);
  }
  ops::attention_backward(dqkv, datt, a.qkv, probs, heads_local_, drop, groups_local_);
  return dqkv;
}

// ---- the three purposes' entries ----------------------------------------------------

ForwardResult GptChunk::forward(int64_t mb_id, const TrainMicroBatch& mb, const Tensor& input) {
  return forward(mb_id, mb, stage_inputs(mb).on(dev_), input);
}

ForwardResult GptChunk::forward(int64_t mb_id, const TrainMicroBatch& mb, const PlacedInputs& placed,
                                const Tensor& input) {
  Pass p;
  p.purpose = Purpose::train;
  p.batch = mb.micro_batch_size;
  p.seq = call_seq();
  p.cp = cp_ > 1;
  p.step_key = mb.step_key;
  p.sample_offset = mb.sample_offset;
  p.train = &mb;
  check_call(p);
  auto saved = std::make_unique<Saved>(p.batch, layers_.size());
  Saved& s = *saved;
  take_placed(placed, p, s);
  const Tensor x = stack_forward(p, s, input);
  ForwardResult res;
  if (spec_.has_head)
    head_train(x, mb, s, res);
  else
    res.output = x;
  p.train = nullptr;  // the caller's micro batch does not outlive this call
  s.pass = p;
  saved_[mb_id] = std::move(saved);
  return res;
}

ForwardResult GptChunk::score(const ScoreMicroBatch& mb, const Tensor& input) {
  Pass p;
  p.purpose = Purpose::score;
  p.batch = mb.micro_batch_size;
  p.seq = call_seq();
  p.cp = cp_ > 1;
  check_call(p);
  Saved s(p.batch, layers_.size());
  place_teacher_forced(mb.tokens, p, s);
  const Tensor x = stack_forward(p, s, input);
  ForwardResult res;
  if (spec_.has_head)
    head_score(x, mb, s, res);
  else
    res.output = x;
  return res;
}

ForwardResult GptChunk::infer(const InferenceCall& call, const Tensor& input) {
  Pass p;
  MTNLG_CHECK(cp_ == 1, "inference runs the model without context parallelism");
  p.purpose = Purpose::infer;
  p.batch = call.batch;
  p.seq = call.seq_len > 0 ? call.seq_len : cfg_.seq_length;
  p.kv = call.kv;
  p.past = call.kv ? call.kv->length : 0;
  check_call(p);
  MTNLG_CHECK(!call.logit_rows || spec_.has_head, "logit rows asked of a chunk without the output layer");
  Saved s(p.batch, layers_.size());
  place_unlabelled(call.tokens, p, s);
  const Tensor x = stack_forward(p, s, input);
  if (call.kv) call.kv->length = p.past + p.seq;
  ForwardResult res;
  if (call.logit_rows)  // the last stage: logits of the asked rows
    res.logits = head_logits(x, *call.logit_rows);
  else
    res.output = x;  // the hidden states (before the final norm)
  return res;
}

// The shared part of every purpose: embed the placed tokens (first stage) or take the
// previous stage's output, then run the layers.
Tensor GptChunk::stack_forward(const Pass& p, Saved& s, const Tensor& input) {
  Tensor x = spec_.has_embedding ? embed(p, s.tokens) : checked_input(input, p);
  if (observer_ && p.train && spec_.has_embedding) observer_(-1, *p.train, x);
  return run_layers(x, p, s);
}

void GptChunk::check_call(const Pass& p) const {
  if (p.purpose != Purpose::train)
    MTNLG_CHECK(cfg_.hidden_dropout == 0 && cfg_.attention_dropout == 0,
                "scoring and inference run the model without dropout");
  if (p.purpose == Purpose::infer)
    MTNLG_CHECK(!cfg_.sequence_parallel, "inference runs the model without sequence parallelism");
  if (p.kv) {
    MTNLG_CHECK(p.kv->batch == p.batch && p.kv->k.size() == layers_.size() && p.past + p.seq <= p.kv->capacity,
                "KV cache of batch {}, {} layers, {} + {} of {} positions does not fit this call (batch {}, {} layers)",
                p.kv->batch, p.kv->k.size(), p.past, p.seq, p.kv->capacity, p.batch, layers_.size());
  }
  if (p.past + p.seq > cfg_.max_positions)
    throw_input("a sequence of {} tokens exceeds the model's {} positions", p.past + p.seq, cfg_.max_positions);
}

// ---- placing the token ids ------------------------------------------------------------
// The ids arrive in host memory: inputs and labels side by side in one buffer, placed on
// the model's device in one upload (none on the CPU; on CUDA an asynchronous copy through
// pinned staging memory, core/cuda/device.hpp).

PlacedLayout PlacedLayout::make(int64_t tokens, bool grad_order, bool keys) {
  PlacedLayout l;
  l.tokens = tokens;
  l.inputs = 0;
  l.labels = tokens;
  int64_t end = 2 * tokens;
  if (grad_order) {
    l.grad_order = end;
    end += 2 * tokens + kGradOrderExtra;
  }
  if (keys) {  // two u64 at an even i32 index of a 256-byte aligned buffer
    l.keys = (end + 1) / 2 * 2;
    end = l.keys + kKeyWords;
  }
  l.total = end;
  return l;
}

PlacedInputs PlacedInputs::empty_like(Device dev) const {
  auto like = [&](const Tensor& t) { return t.defined() ? Tensor::empty(t.shape(), t.dtype(), dev) : Tensor(); };
  return {layout, like(ids), like(dloss), like(mask), like(moe_dloss)};
}

PlacedInputs PlacedInputs::on(Device dev) const {
  auto put = [&](const Tensor& t) { return t.defined() ? t.on(dev) : Tensor(); };
  return {layout, put(ids), put(dloss), put(mask), put(moe_dloss)};
}

void PlacedInputs::copy_from(const PlacedInputs& src) {
  MTNLG_CHECK(src.layout.total == layout.total && src.layout.tokens == layout.tokens &&
                  src.dloss.defined() == dloss.defined() && src.mask.defined() == mask.defined() &&
                  src.moe_dloss.defined() == moe_dloss.defined(),
              "placed inputs of {} tokens refilled from ones of {} tokens or another layout", layout.tokens,
              src.layout.tokens);
  ids.copy_from(src.ids);
  if (dloss.defined()) dloss.copy_from(src.dloss);
  if (mask.defined()) mask.copy_from(src.mask);
  if (moe_dloss.defined()) moe_dloss.copy_from(src.moe_dloss);
}

// tokens [B, T + 1] (teacher forcing) into inputs [B*L] = tokens[:, pos] and labels [B*L] =
// tokens[:, pos + 1] at this rank's positions (all T of them without context parallelism):
// what training and scoring place.
void GptChunk::split_tokens(const int32_t* tokens, int64_t B, int32_t* inputs, int32_t* labels) const {
  const int64_t T = cfg_.seq_length, L = static_cast<int64_t>(cp_pos_.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i) {
      const int64_t t = cp_pos_[static_cast<size_t>(i)];
      inputs[b * L + i] = tokens[b * (T + 1) + t];
      labels[b * L + i] = tokens[b * (T + 1) + t + 1];
    }
}

std::vector<float> GptChunk::local_mask(const float* mask, int64_t B) const {
  const int64_t T = cfg_.seq_length, L = static_cast<int64_t>(cp_pos_.size());
  std::vector<float> out(static_cast<size_t>(B * L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i) out[static_cast<size_t>(b * L + i)] = mask[b * T + cp_pos_[static_cast<size_t>(i)]];
  return out;
}

// Rotary positions: past + t, or under context parallelism each of the rows' two chunks at
// its first global position (one call per sample and chunk).
void GptChunk::rotate(Tensor& qkv, const Pass& p, bool backward) const {
  if (!p.cp) {
    if (backward)
      rotary_.backward(qkv, heads_local_, groups_local_, 0);
    else
      rotary_.forward(qkv, heads_local_, groups_local_, p.kv ? p.kv->length : 0);
    return;
  }
  if (!rotary_.on) return;
  const int64_t B = qkv.dim(0), L = qkv.dim(1), W = qkv.dim(2), c = L / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < 2; ++h) {
      Tensor part = qkv.flat((b * L + h * c) * W, c * W).view({1, c, W});
      const int64_t first = cp_pos_[static_cast<size_t>(h * c)];
      if (backward)
        ops::rope_backward(part, part, heads_local_, groups_local_, rotary_.params, first);
      else
        ops::rope_forward(part, part, heads_local_, groups_local_, rotary_.params, first);
    }
}

// The learned position table's rows at this rank's positions: its two chunks, [L, C].
Tensor GptChunk::position_rows(const Tensor& table) const {
  const int64_t L = static_cast<int64_t>(cp_pos_.size()), c = L / 2;
  Tensor rows = Tensor::empty({L, table.dim(1)}, table.dtype(), dev_);
  for (int64_t h = 0; h < 2; ++h) {
    Tensor dst = rows.rows(h * c, c);
    ops::copy(dst, table.rows(cp_pos_[static_cast<size_t>(h * c)], c));
  }
  return rows;
}

void GptChunk::add_position_rows_grad(Tensor& dtable, const Tensor& drows) const {
  const int64_t c = drows.dim(0) / 2;
  for (int64_t h = 0; h < 2; ++h) {
    Tensor dst = dtable.rows(cp_pos_[static_cast<size_t>(h * c)], c);
    ops::add_inplace(dst, drows.rows(h * c, c));
  }
}

// Training on CUDA adds the first stage's grouping by token and the dropout keys.
PlacedLayout GptChunk::train_layout(int64_t tokens) const {
  const bool cuda = dev_ == Device::cuda;
  return PlacedLayout::make(tokens, spec_.has_embedding && cuda, cuda);
}

PlacedInputs GptChunk::stage_inputs(const TrainMicroBatch& mb) const {
  const int64_t B = mb.micro_batch_size, N = B * call_seq();
  PlacedInputs h;
  h.layout = train_layout(N);
  h.ids = Tensor::zeros({h.layout.total}, DType::i32, Device::cpu);
  int32_t* ids = h.ids.data<int32_t>();
  int32_t* in = ids + h.layout.inputs;
  split_tokens(mb.tokens, B, in, ids + h.layout.labels);
  if (h.layout.grad_order >= 0) {
    const Tensor o = ops::embedding_grad_order(in, N);
    std::copy(o.data<int32_t>(), o.data<int32_t>() + o.numel(), ids + h.layout.grad_order);
  }
  if (h.layout.keys >= 0) {
    const uint64_t keys[2] = {mb.step_key, static_cast<uint64_t>(mb.sample_offset)};
    std::memcpy(ids + h.layout.keys, keys, sizeof keys);
  }
  if (!moe_stats_.empty()) {  // the MoE losses' weight, read by the backward's kernels
    h.moe_dloss = Tensor::empty({1}, DType::f64, Device::cpu);
    h.moe_dloss.data<double>()[0] = mb.moe_loss_weight;
  }
  if (spec_.has_head) {
    // The loss gradient per token, loss_weight x mask, rounded once to the statistics dtype.
    const std::vector<float> mask = mb.loss_mask ? local_mask(mb.loss_mask, B) : std::vector<float>();
    h.dloss = Tensor::empty({N}, stats_dtype(), Device::cpu);
    for (int64_t i = 0; i < N; ++i) {
      const double g = mb.loss_weight * (mb.loss_mask ? mask[static_cast<size_t>(i)] : 1.0);
      if (h.dloss.dtype() == DType::f64)
        h.dloss.data<double>()[i] = g;
      else
        h.dloss.data<float>()[i] = static_cast<float>(g);
    }
    if (mb.loss_mask) {
      h.mask = Tensor::empty({N}, DType::f32, Device::cpu);
      std::copy(mask.begin(), mask.end(), h.mask.data<float>());
    }
  }
  return h;
}

void GptChunk::take_placed(const PlacedInputs& in, Pass& p, Saved& s) const {
  const int64_t N = p.tokens();
  const PlacedLayout want = train_layout(N);
  auto fits = [&](const Tensor& t, int64_t n) { return t.defined() && t.numel() == n && t.device() == dev_; };
  const bool masked = p.train && p.train->loss_mask;
  MTNLG_CHECK(in.layout.total == want.total && in.layout.keys == want.keys && in.layout.grad_order == want.grad_order &&
                  fits(in.ids, want.total) && (!spec_.has_head || fits(in.dloss, N)) &&
                  (!spec_.has_head || !masked || fits(in.mask, N)) && (moe_stats_.empty() || fits(in.moe_dloss, 1)),
              "placed inputs do not fit a micro batch of {} x {} tokens on this chunk", p.batch, p.seq);
  s.tokens = in.inputs();
  s.targets = in.labels();
  if (want.grad_order >= 0)
    s.order = ops::EmbeddingGradOrder::from(in.ids.flat(want.grad_order, 2 * N + PlacedLayout::kGradOrderExtra), N);
  if (want.keys >= 0) {
    s.keys = in.ids.flat(want.keys, PlacedLayout::kKeyWords);
    p.keys_dev = reinterpret_cast<const uint64_t*>(s.keys.raw());
  }
  s.dloss = in.dloss;
  s.mask = in.mask;
  p.moe_dloss = in.moe_dloss;
}

// Scoring: [B, T + 1] tokens split into inputs and labels, as training does.
void GptChunk::place_teacher_forced(const int32_t* tokens, const Pass& p, Saved& s) const {
  const int64_t N = p.tokens();
  MTNLG_CHECK(p.seq == call_seq(), "a teacher-forced call holds {} positions per sample, not {}", call_seq(), p.seq);
  const PlacedLayout l = PlacedLayout::make(N, false, false);
  Tensor ids = Tensor::zeros({l.total}, DType::i32, Device::cpu);
  split_tokens(tokens, p.batch, ids.data<int32_t>() + l.inputs, ids.data<int32_t>() + l.labels);
  const Tensor placed = ids.on(dev_);
  s.tokens = placed.flat(l.inputs, N);
  s.targets = placed.flat(l.labels, N);
}

// Inference: [B, T] inputs, no labels (zeros).
void GptChunk::place_unlabelled(const int32_t* tokens, const Pass& p, Saved& s) const {
  const int64_t N = p.tokens();
  const PlacedLayout l = PlacedLayout::make(N, false, false);
  Tensor ids = Tensor::zeros({l.total}, DType::i32, Device::cpu);
  std::copy(tokens, tokens + N, ids.data<int32_t>() + l.inputs);
  const Tensor placed = ids.on(dev_);
  s.tokens = placed.flat(l.inputs, N);
  s.targets = placed.flat(l.labels, N);
}

// ---- the layer stack ------------------------------------------------------------------

// First stage: vocab-parallel lookup (the sum of the tp ranks' masked lookups), positions
// past .. past + T - 1, embedding dropout; this rank's rows of the residual stream.
Tensor GptChunk::embed(const Pass& p, const Tensor& tokens) {
  const bool sp = cfg_.sequence_parallel;
  const int64_t B = p.batch, T = p.seq, past = p.past;
  const int64_t R = local_rows(B, T), row_start = sp ? tp_rank_ * R : 0;
  Tensor partial = Tensor::empty({B * T, cfg_.hidden}, cfg_.dtype, dev_);
  ops::embedding_forward(partial, tokens, wte_, vocab_start_);
  Tensor x = tp::leave_row_parallel_forward(groups_.tp.get(), sp, partial);
  if (!cfg_.rope && p.cp)  // row b*L + i: this cp rank's position i
    ops::position_forward(x, position_rows(wpe_), row_start, T);
  else if (!cfg_.rope)  // row b*T + t: position past + t (rotary positions enter each layer's attention instead)
    ops::position_forward(x, past > 0 ? wpe_.rows(past, T) : wpe_, row_start, T);
  const DropSite drop = hidden_drop(p, -1, kEmbedding, R);
  ops::dropout_forward(x, x, cfg_.hidden_dropout, drop.key, drop.base, drop.dkey);
  return x;
}

Tensor GptChunk::checked_input(const Tensor& input, const Pass& p) const {
  const int64_t R = local_rows(p.batch, p.seq), C = cfg_.hidden;
  MTNLG_CHECK(input.defined() && input.dim(0) == R && input.dim(1) == C, "chunk input must be [{}, {}], got {}", R, C,
              shape_str(input.shape()));
  return input;
}

// The chunk's layers; what each keeps: for training everything (no recompute or
// selective) or only its input (full recompute), for scoring and inference nothing.
// A layer's last residual add computes the LayerNorm that reads its output in the same
// pass: the next layer's input LayerNorm, after the last layer the final one when the
// loss head follows (training and scoring). Not while a layer observer runs: it may
// change a layer's output (the poison fault) before the next layer reads it.
Tensor GptChunk::run_layers(Tensor x, const Pass& p, Saved& s) {
  const bool train = p.purpose == Purpose::train;
  const bool full_recompute = cfg_.recompute == RecomputeGranularity::full;
  const bool observe = observer_ && train;
  const bool loss_head = spec_.has_head && p.purpose != Purpose::infer;
  const int64_t R = x.dim(0);
  for (size_t li = 0; li < layers_.size(); ++li) {
    Tensor y;
    LayerActs& a = s.layers[li];
    NextNorm next{}, *nextp = nullptr;
    if (!observe && li + 1 < layers_.size()) {
      LayerActs& n = s.layers[li + 1];
      next = next_norm(n.ln1, n.mean1, n.rstd1, layers_[li + 1].ln1_w, layers_[li + 1].ln1_b, R);
      nextp = &next;
    } else if (!observe && loss_head) {
      next = next_norm(s.lnf, s.meanf, s.rstdf, lnf_w_, lnf_b_, R);
      nextp = &next;
    }
    layer_forward(static_cast<int64_t>(li), x, y, a, p, nextp);
    if (observe) observer_(spec_.first_layer + static_cast<int64_t>(li), *p.train, y);
    if (!train) {
      a = LayerActs{};
    } else if (full_recompute) {
      Tensor keep = a.x_in;
      a = LayerActs{};
      a.x_in = keep;
    }
    x = y;
  }
  return x;
}

// ---- the heads ------------------------------------------------------------------------

GptChunk::LossStats GptChunk::head_loss_stats(const Tensor& x, Saved& s, const LogitsChunkFn& each) {
  const int64_t C = cfg_.hidden, R = x.dim(0), N = s.tokens.numel();
  const DType dt = cfg_.dtype, wide = stats_dtype();
  auto* tpc = groups_.tp.get();
  const bool tp_split = tpc && tpc->size() > 1;
  s.x_out = x;
  if (!s.lnf.defined()) {  // else the last layer's residual add computed it (run_layers)
    s.lnf = Tensor::empty({R, C}, dt, dev_);
    norm_.stats(s.meanf, s.rstdf, R, wide, dev_);
    norm_.forward(s.lnf, s.meanf, s.rstdf, x, lnf_w_, lnf_b_);
  }
  const Tensor lnf_full = tp::enter_column_parallel_forward(tpc, cfg_.sequence_parallel, s.lnf);
  s.lnf = Tensor();  // the backward needs only its statistics
  LossStats st{Tensor::empty({N}, wide, dev_), Tensor::empty({N}, wide, dev_), Tensor::empty({N}, wide, dev_)};
  const int64_t step = logits_chunk_rows(N, vocab_local_, cfg_.logits_chunk_elements);
  for (int64_t r0 = 0; r0 < N; r0 += step) {
    const int64_t n = std::min(step, N - r0);
    const Tensor in = lnf_full.rows(r0, n), targets = s.targets.flat(r0, n);
    Tensor logits = Tensor::empty({n, vocab_local_}, dt, dev_);
    ops::matmul_forward(logits, in, out_w_, nullptr);
    Tensor mx = st.rowmax.flat(r0, n), se = st.sumexp.flat(r0, n), tl = st.target_logit.flat(r0, n);
    ops::xent_rowmax(mx, logits, vocab_valid_);
    if (tp_split) tp::all_reduce(tpc, mx, parallel::ReduceOp::max);
    // A shard with no real vocabulary reports -inf; the global max is finite.
    ops::xent_sumexp_target(se, tl, logits, targets, mx, vocab_start_, vocab_valid_);
    if (tp_split) {
      tp::all_reduce(tpc, se);
      tp::all_reduce(tpc, tl);
    }
    each(r0, n, logits, in, st);
  }
  return st;
}

// Training: each chunk's loss goes to mb.loss_acc (or is read on the host without it) and,
// the loss gradient being known already (PlacedInputs::dloss), the chunk's backward through
// the logits runs at once: the logits' gradient in place, the tied embedding's gradient,
// and those rows of the final LayerNorm's output gradient, which is all the backward keeps
// of the head (dlnf_full).
void GptChunk::head_train(const Tensor& x, const TrainMicroBatch& mb, Saved& s, ForwardResult& res) {
  const int64_t N = s.tokens.numel();
  s.dlnf_full = Tensor::empty({N, cfg_.hidden}, cfg_.dtype, dev_);
  const LossStats st =
      head_loss_stats(x, s, [&](int64_t r0, int64_t n, Tensor& logits, const Tensor& in, const LossStats& part) {
        const Tensor mx = part.rowmax.flat(r0, n), se = part.sumexp.flat(r0, n), tl = part.target_logit.flat(r0, n);
        if (mb.loss_acc) {  // the loss stays on the device
          const Tensor mask = s.mask.defined() ? s.mask.flat(r0, n) : Tensor();
          ops::xent_loss_accumulate(*mb.loss_acc, mx, se, tl, mask.defined() ? &mask : nullptr);
        }
        ops::xent_backward(logits, logits, s.targets.flat(r0, n), mx, se, s.dloss.flat(r0, n), vocab_start_,
                           vocab_valid_);
        Tensor dlnf_rows = s.dlnf_full.rows(r0, n);
        ops::matmul_backward(&dlnf_rows, &d_out_w_, nullptr, logits, in, out_w_);
      });
  s.dloss = Tensor();
  s.mask = Tensor();
  if (!mb.loss_acc) {
    const std::vector<float> mask = mb.loss_mask ? local_mask(mb.loss_mask, mb.micro_batch_size) : std::vector<float>();
    read_loss_terms(st, mb.loss_mask ? mask.data() : nullptr, false, res);
  }
}

// Scoring: the loss terms into mb.loss_acc (validation) or read on the host (eval, with
// per-token scores when asked). Nothing of the head is kept.
void GptChunk::head_score(const Tensor& x, const ScoreMicroBatch& mb, Saved& s, ForwardResult& res) {
  Tensor mask;
  const std::vector<float> local = mb.loss_mask ? local_mask(mb.loss_mask, mb.micro_batch_size) : std::vector<float>();
  if (mb.loss_mask && mb.loss_acc && !mb.token_scores) {
    const int64_t N = s.tokens.numel();
    Tensor h = Tensor::empty({N}, DType::f32, Device::cpu);
    std::copy(local.begin(), local.end(), h.data<float>());
    mask = h.on(dev_);
  }
  const bool device_loss = mb.loss_acc && !mb.token_scores;
  const LossStats st = head_loss_stats(x, s, [&](int64_t r0, int64_t n, Tensor&, const Tensor&, const LossStats& part) {
    if (!device_loss) return;
    const Tensor m = mask.defined() ? mask.flat(r0, n) : Tensor();
    ops::xent_loss_accumulate(*mb.loss_acc, part.rowmax.flat(r0, n), part.sumexp.flat(r0, n),
                              part.target_logit.flat(r0, n), m.defined() ? &m : nullptr);
  });
  if (!device_loss) read_loss_terms(st, mb.loss_mask ? local.data() : nullptr, mb.token_scores, res);
}

void GptChunk::read_loss_terms(const LossStats& st, const float* loss_mask, bool token_scores,
                               ForwardResult& res) const {
  // One copy of each off a device.
  const Tensor rowmax_h = st.rowmax.on(Device::cpu), sumexp_h = st.sumexp.on(Device::cpu),
               target_h = st.target_logit.on(Device::cpu);
  const int64_t N = rowmax_h.numel();
  const bool f64 = rowmax_h.dtype() == DType::f64;
  auto at = [&](const Tensor& t, int64_t i) { return f64 ? t.data<double>()[i] : double{t.data<float>()[i]}; };
  double loss_sum = 0, count = 0;
  for (int64_t i = 0; i < N; ++i) {
    const double m = loss_mask ? loss_mask[i] : 1.0;
    const double mx = at(rowmax_h, i), se = at(sumexp_h, i), tl = at(target_h, i);
    const double li = std::log(se) + mx - tl;
    loss_sum += m * li;
    count += m;
    if (token_scores) {
      res.token_logprob.push_back(-li);
      res.token_greedy.push_back(tl >= mx ? 1 : 0);  // the label's logit is the global maximum
    }
  }
  res.loss_sum = loss_sum;
  res.loss_tokens = count;
}

// Logits of some rows of the chunk output x [N, C] (inference): gather the rows (the
// embedding lookup is a row gather), final LayerNorm, logits against this rank's
// vocabulary shard, then the shards of every tp rank side by side.
Tensor GptChunk::head_logits(const Tensor& x, const std::vector<int64_t>& rows) {
  const int64_t C = cfg_.hidden, n = static_cast<int64_t>(rows.size()), N = x.dim(0);
  const DType dt = cfg_.dtype, wide = stats_dtype();
  MTNLG_CHECK(n > 0, "no logit rows asked for");
  Tensor idx = Tensor::empty({n}, DType::i32, Device::cpu);
  for (int64_t i = 0; i < n; ++i) {
    MTNLG_CHECK(rows[i] >= 0 && rows[i] < N, "logit row {} outside the {} rows of the call", rows[i], N);
    idx.data<int32_t>()[i] = static_cast<int32_t>(rows[i]);
  }
  Tensor sel = Tensor::empty({n, C}, dt, dev_);
  ops::embedding_forward(sel, idx.on(dev_), x, 0);
  Tensor h = Tensor::empty({n, C}, dt, dev_), mean, rstd;
  norm_.stats(mean, rstd, n, wide, dev_);
  norm_.forward(h, mean, rstd, sel, lnf_w_, lnf_b_);
  Tensor local = Tensor::empty({n, vocab_local_}, dt, dev_);
  ops::matmul_forward(local, h, out_w_, nullptr);
  if (tp_ == 1) return local;
  Tensor gathered = Tensor::empty({tp_ * n, vocab_local_}, dt, dev_);  // rank-major blocks of n rows
  tp::all_gather_rows(groups_.tp.get(), local, gathered);
  Tensor out = Tensor::empty({n, cfg_.padded_vocab_size}, dt, dev_);
  Tensor pieces = out.view({n * tp_, vocab_local_});  // row i*tp + r = row i's columns of rank r
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < tp_; ++r) {
      Tensor dst = pieces.rows(i * tp_ + r, 1);
      ops::copy(dst, gathered.rows(r * n + i, 1));
    }
  return out;
}

Tensor GptChunk::backward(int64_t mb_id, const Tensor& dout, bool last_backward) {
  auto it = saved_.find(mb_id);
  MTNLG_CHECK(it != saved_.end(), "backward of micro batch {} without its forward", mb_id);
  std::unique_ptr<Saved> saved = std::move(it->second);
  saved_.erase(it);
  Saved& s = *saved;
  const Pass& p = s.pass;  // the forward's call, with its placed keys
  const int64_t C = cfg_.hidden, T = p.seq, B = s.mbs;
  const DType dt = cfg_.dtype;
  const bool sp = cfg_.sequence_parallel;
  auto* tpc = groups_.tp.get();
  const int64_t R = local_rows(B);
  const int64_t row_start = sp ? tp_rank_ * R : 0;

  Tensor dx;
  if (spec_.has_head) {
    // The head's backward through the logits ran in the forward (head_loss).
    MTNLG_CHECK(s.dlnf_full.defined(), "backward of micro batch {} after a forward that computed no loss gradient",
                mb_id);
    Tensor dlnf = tp::enter_column_parallel_backward(tpc, sp, s.dlnf_full);
    s.dlnf_full = Tensor();
    dx = Tensor::empty({R, C}, dt, dev_);
    norm_.backward(dx, d_lnf_w_, d_lnf_b_, dlnf, s.x_out, lnf_w_, s.meanf, s.rstdf);
    report_ready(head_param_offsets_, last_backward);
  } else {
    MTNLG_CHECK(dout.defined() && dout.dim(0) == R, "chunk backward needs the output gradient [{}, {}]", R, C);
    dx = dout;
  }

  const bool full_recompute = cfg_.recompute == RecomputeGranularity::full;
  for (int64_t li = static_cast<int64_t>(layers_.size()) - 1; li >= 0; --li) {
    LayerActs& a = s.layers[li];
    if (full_recompute) {  // re-run this layer's forward from its saved input
      const timing::StepPartScope part(timing::StepPart::recompute);
      Tensor y;
      Tensor x_in = a.x_in;
      recomputing_ = true;  // the routing was recorded by the first forward
      layer_forward(li, x_in, y, a, p);
      recomputing_ = false;
    }
    Tensor dprev;
    layer_backward(li, dx, dprev, a, p);
    report_ready(layer_param_offsets_[static_cast<size_t>(li)], last_backward);
    a = LayerActs{};  // free as we go
    dx = dprev;
  }

  if (!spec_.has_embedding) return dx;
  // Embedding: x = dropout(allreduce(lookup) + pos)
  const DropSite drop = hidden_drop(p, -1, kEmbedding, R);
  ops::dropout_backward(dx, dx, cfg_.hidden_dropout, drop.key, drop.base, drop.dkey);
  if (!cfg_.rope && p.cp) {  // into this rank's rows of the table, then added at their positions
    Tensor drows = Tensor::empty({T, C}, d_wpe_.dtype(), dev_);
    ops::fill(drows, 0.0);
    ops::position_backward(drows, dx, row_start, T);
    add_position_rows_grad(d_wpe_, drows);
  } else if (!cfg_.rope) {
    ops::position_backward(d_wpe_, dx, row_start, T);
  }
  Tensor dfull = tp::leave_row_parallel_backward(tpc, sp, dx);
  ops::embedding_backward(d_wte_, s.tokens, dfull, vocab_start_, s.order.rows.defined() ? &s.order : nullptr);
  report_ready(embedding_param_offsets_, last_backward);
  return Tensor();
}

}  // namespace mtnlg::model
