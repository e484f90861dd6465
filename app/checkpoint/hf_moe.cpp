// Hugging Face Mixtral (MixtralForCausalLM), Qwen2-MoE (Qwen2MoeForCausalLM) and Qwen3-MoE
// (Qwen3MoeForCausalLM): the Llama family's embeddings, attention and norms (hf_llama.cpp
// writes and reads them) with routed SwiGLU experts in the MoE layers' MLP. Their routers
// take a softmax over all experts and keep the top k: Mixtral renormalises the k weights
// (mtnlg's softmax top-k), Qwen's norm_topk_prob says whether it does (false: mtnlg's
// moe_router_pre_softmax). Qwen2-MoE adds a shared expert gated by sigmoid(x . w) and
// Qwen2's q/k/v biases; Qwen3-MoE has Qwen3's per-head q/k norms and no shared expert. The
// tensors, per MoE layer (transformers 4's names; export writes these):
//   Mixtral  model.layers.{l}.block_sparse_moe.gate.weight [E, H],
//            ...block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) [F, H], w2 (down) [H, F]
//   Qwen     model.layers.{l}.mlp.gate.weight [E, H],
//            ...mlp.experts.{e}.gate_proj / up_proj [F, H], down_proj [H, F],
//            Qwen2-MoE: ...mlp.shared_expert.gate_proj / up_proj [S, H], down_proj [H, S],
//            ...mlp.shared_expert_gate.weight [1, H]
// and transformers 5's fused form, which import reads as well: per layer
// mlp.experts.gate_up_proj [E, 2F, H] (expert e's gate rows, then its up rows) and
// mlp.experts.down_proj [E, H, F], Mixtral's router renamed mlp.gate.weight. mtnlg's
// expert e holds linear_fc1 [2F, H] (gate then up) and linear_fc2 [H, F]: the same rows.
#include <fmt/format.h>

#include "app/checkpoint/hf_families.hpp"
#include "core/log.hpp"

namespace mtnlg::app::hf {

namespace {

const char* arch_of(MoeKind k) {
  return k == MoeKind::mixtral     ? "MixtralForCausalLM"
         : k == MoeKind::qwen2_moe ? "Qwen2MoeForCausalLM"
                                   : "Qwen3MoeForCausalLM";
}

// The class that expresses an MoE model: q/k norms make it Qwen3-MoE, a shared expert
// Qwen2-MoE, anything else Mixtral (moe_unfit says when that class cannot).
MoeKind export_kind(const ModelConfig& m) {
  if (m.qk_layernorm) return MoeKind::qwen3_moe;
  if (m.moe.moe_shared_expert_intermediate_size > 0) return MoeKind::qwen2_moe;
  return MoeKind::mixtral;
}

// The prefix of layer l's MoE tensors: Mixtral's block_sparse_moe (transformers 4) or mlp.
std::string moe_prefix(MoeKind k, int64_t l, bool block_sparse) {
  return fmt::format("model.layers.{}.{}", l, k == MoeKind::mixtral && block_sparse ? "block_sparse_moe." : "mlp.");
}

// An expert's gate, up and down projections under transformers 4's names.
struct ProjNames {
  const char *gate, *up, *down;
};
ProjNames proj_names(MoeKind k) {
  if (k == MoeKind::mixtral) return {"w1", "w3", "w2"};
  return {"gate_proj", "up_proj", "down_proj"};
}

int64_t expert_width(const ModelConfig& m) {
  return m.moe.moe_ffn_hidden_size > 0 ? m.moe.moe_ffn_hidden_size : m.ffn_hidden_size;
}

// Rows [a, a + n) of a parameter.
Tensor param_rows(const model::LoadedModel& m, const std::string& name, int64_t a, int64_t n) {
  const Tensor p = m.store.param(name);
  Tensor t = Tensor::empty({n, p.dim(1)});
  std::copy_n(p.data<float>() + a * p.dim(1), n * p.dim(1), t.data<float>());
  return t;
}

}  // namespace

std::string moe_unfit(const ModelConfig& m) {
  const MoeConfig& e = m.moe;
  const bool shared = e.moe_shared_expert_intermediate_size > 0;
  std::string why;
  if (m.add_bias_linear)
    why =
        "model.add_bias_linear: true with MoE layers (the experts of Mixtral, Qwen2-MoE and Qwen3-MoE have no biases)";
  else if (e.moe_router_load_balancing_type == MoeLoadBalancing::sinkhorn)
    why = "model.moe_router_load_balancing_type: sinkhorn (their routers choose by the router's own weights)";
  else if (e.moe_router_score_function != MoeScoreFunction::softmax)
    why = fmt::format("model.moe_router_score_function: {} (their routers take a softmax)",
                      to_string(e.moe_router_score_function));
  else if (e.moe_router_topk_scaling_factor != 0.0 && e.moe_router_topk_scaling_factor != 1.0)
    why = fmt::format("model.moe_router_topk_scaling_factor: {} (their routing weights are not scaled)",
                      e.moe_router_topk_scaling_factor);
  else if (e.moe_router_group_topk > 0)
    why = "model.moe_router_group_topk: group-limited routing (their routers choose among all experts)";
  else if (shared && m.qk_layernorm)
    why =
        "model.moe_shared_expert_intermediate_size with model.qk_layernorm (Qwen3-MoE has no shared expert, "
        "Qwen2-MoE no q/k norms)";
  else if (shared && !e.moe_shared_expert_gate)
    why = "model.moe_shared_expert_gate: false with a shared expert (Qwen2-MoE gates its shared expert)";
  else if (shared && !m.add_qkv_bias)
    why = "model.add_qkv_bias: false with a shared expert (Qwen2-MoE has q/k/v biases)";
  else if (!shared && !m.qk_layernorm && m.add_qkv_bias)
    why = "model.add_qkv_bias: true without a shared expert or q/k norms (Mixtral has no biases)";
  else if (!shared && !m.qk_layernorm && e.moe_router_pre_softmax)
    why =
        "model.moe_router_pre_softmax: true without a shared expert or q/k norms (Mixtral renormalises its top-k "
        "weights)";
  for (int64_t l = 0; why.empty() && !shared && !m.qk_layernorm && l < m.num_layers; ++l)
    if (!e.is_moe_layer(l))
      why = fmt::format(
          "model.moe_layer_freq: layer {} is dense without a shared expert or q/k norms (every layer of Mixtral is "
          "MoE)",
          l);
  if (why.empty()) return "";
  return why + ": Hugging Face's MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM cannot express it";
}

namespace {

// config.json of an MoE export: the field names of transformers' MixtralConfig,
// Qwen2MoeConfig and Qwen3MoeConfig.
nlohmann::ordered_json moe_config(const ModelConfig& mc, const model::GptConfig& c, MoeKind kind) {
  const bool mixtral = kind == MoeKind::mixtral, qwen2 = kind == MoeKind::qwen2_moe;
  const int64_t L = c.num_layers_total;
  nlohmann::ordered_json j;
  j["architectures"] = {arch_of(kind)};
  j["model_type"] = mixtral ? "mixtral" : qwen2 ? "qwen2_moe" : "qwen3_moe";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = mixtral ? c.moe.ffn : c.ffn;  // Qwen: the dense layers' width
  if (!mixtral) j["moe_intermediate_size"] = c.moe.ffn;
  if (qwen2) j["shared_expert_intermediate_size"] = c.moe.shared_ffn;
  j["num_hidden_layers"] = L;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_groups();
  if (!qwen2) j["head_dim"] = c.head_dim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_positions;
  j["initializer_range"] = c.init_std;
  j["rms_norm_eps"] = c.layernorm_eps;
  j["rope_theta"] = mc.rotary_base;
  j["rope_scaling"] = llama_rope_scaling(mc);
  j[mixtral ? "num_local_experts" : "num_experts"] = c.moe.num_experts;
  j["num_experts_per_tok"] = mc.moe.moe_router_topk;
  if (mixtral) {
    j["sliding_window"] = nullptr;
    j["router_jitter_noise"] = 0.0;
  } else {
    j["norm_topk_prob"] = !mc.moe.moe_router_pre_softmax;
    j["decoder_sparse_step"] = 1;  // which layers are dense: mlp_only_layers alone
    nlohmann::ordered_json dense = nlohmann::ordered_json::array();
    for (int64_t l = 0; l < L; ++l)
      if (!c.moe.is_moe(l)) dense.push_back(l);
    j["mlp_only_layers"] = dense;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    if (qwen2) {
      j["qkv_bias"] = true;
      j["max_window_layers"] = L;
    } else {
      j["attention_bias"] = false;
    }
  }
  const bool balanced = mc.moe.moe_router_load_balancing_type != MoeLoadBalancing::none;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = balanced ? mc.moe.moe_aux_loss_coeff : 0.0;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["tie_word_embeddings"] = !c.untied;
  return j;
}

}  // namespace

Export moe_export(const ModelConfig& mc, const model::LoadedModel& m) {
  const auto& c = m.cfg;
  const MoeKind kind = export_kind(mc);
  const int64_t C = c.hidden, E = c.moe.num_experts, F = c.moe.ffn, S = c.moe.shared_ffn;
  const ProjNames pn = proj_names(kind);
  Export ex = llama_export(mc, m, [&m, kind, pn, C, E, F, S](int64_t l, std::vector<OutTensor>& out) {
    const std::string p = fmt::format("layers.{}.mlp.", l), h = moe_prefix(kind, l, true);
    auto same = [&](const std::string& hf, const std::string& ours) {
      out.push_back({hf, m.store.param(ours).shape(), [&m, ours] { return param_copy(m, ours); }});
    };
    auto rows = [&](const std::string& hf, const std::string& ours, int64_t a, int64_t n) {
      out.push_back({hf, {n, C}, [&m, ours, a, n] { return param_rows(m, ours, a, n); }});
    };
    same(h + "gate.weight", p + "router.weight");
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = fmt::format("{}experts.{}.", h, e), ours = fmt::format("{}experts.local_experts.{}.", p, e);
      rows(x + pn.gate + ".weight", ours + "linear_fc1.weight", 0, F);
      rows(x + pn.up + ".weight", ours + "linear_fc1.weight", F, F);
      same(x + pn.down + ".weight", ours + "linear_fc2.weight");
    }
    if (S == 0) return;
    rows(h + "shared_expert.gate_proj.weight", p + "shared_experts.linear_fc1.weight", 0, S);
    rows(h + "shared_expert.up_proj.weight", p + "shared_experts.linear_fc1.weight", S, S);
    same(h + "shared_expert.down_proj.weight", p + "shared_experts.linear_fc2.weight");
    same(h + "shared_expert_gate.weight", p + "shared_experts.gate_weight");
  });
  ex.config = moe_config(mc, c, kind);
  return ex;
}

namespace {

// Which layers are MoE: Mixtral's all; Qwen's those with (l + 1) % decoder_sparse_step == 0
// that mlp_only_layers does not list.
std::vector<int64_t> sparse_layers(const Config& cfg, MoeKind kind, int64_t L) {
  std::vector<int64_t> pattern(static_cast<size_t>(L), 1);
  if (kind == MoeKind::mixtral) return pattern;
  const int64_t step = cfg.integer("decoder_sparse_step", 1);
  if (step < 1) cfg.bad("decoder_sparse_step", fmt::format("{}: must be at least 1", step));
  for (int64_t l = 0; l < L; ++l) pattern[static_cast<size_t>(l)] = (l + 1) % step == 0;
  if (cfg.has("mlp_only_layers")) {
    const auto& dense = cfg.j["mlp_only_layers"];
    if (!dense.is_array()) cfg.bad("mlp_only_layers", "not a list of layer numbers");
    for (const auto& d : dense) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() >= L)
        cfg.bad("mlp_only_layers", fmt::format("{}: not a layer number below num_hidden_layers {}", d.dump(), L));
      pattern[d.get<size_t>()] = 0;
    }
  }
  if (std::find(pattern.begin(), pattern.end(), 1) == pattern.end())
    cfg.bad("decoder_sparse_step", "with mlp_only_layers no layer is MoE (a dense model: import it as one)");
  return pattern;
}

// The MoE keys of config.json as recipe keys (", key: value, ..."); InputError naming the
// config.json field mtnlg cannot represent.
std::string moe_keys(const Config& cfg, MoeKind kind) {
  const bool mixtral = kind == MoeKind::mixtral, qwen2 = kind == MoeKind::qwen2_moe;
  const int64_t L = cfg.integer("num_hidden_layers");
  // Fields whose defaults in these config classes differ from the Llama mapping's
  // (num_key_value_heads 8, 16 or 4, not the heads; Mixtral's rms_norm_eps 1e-5 and
  // rope_theta 1e6): required rather than guessed (transformers writes them all).
  cfg.integer("num_key_value_heads");
  if (mixtral && !cfg.has("rms_norm_eps")) cfg.bad("rms_norm_eps", "missing (MixtralConfig's default is 1e-5)");
  if (mixtral && !cfg.has("rope_theta") && !cfg.has("rope_parameters"))
    cfg.bad("rope_theta", "missing, and no rope_parameters (MixtralConfig's default is 1e6)");
  // the config classes' defaults, as transformers takes them
  const char* experts_key = mixtral ? "num_local_experts" : "num_experts";
  const int64_t E = cfg.integer(experts_key, mixtral ? 8 : qwen2 ? 60 : 128);
  if (E < 1) cfg.bad(experts_key, fmt::format("{}: must be positive", E));
  const int64_t k = cfg.integer("num_experts_per_tok", mixtral ? 2 : qwen2 ? 4 : 8);
  if (k < 1 || k > E) cfg.bad("num_experts_per_tok", fmt::format("{}: not between 1 and {} {}", k, experts_key, E));
  const bool renorm = mixtral || cfg.boolean("norm_topk_prob", false);
  if (k == 1 && renorm)
    cfg.bad("num_experts_per_tok",
            fmt::format("1 with renormalised top-k weights{}: the weight is always 1, so the router would learn "
                        "nothing (mtnlg refuses it, as Megatron-Core)",
                        mixtral ? " (Mixtral)" : " (norm_topk_prob true)"));
  const int64_t F =
      mixtral ? cfg.integer("intermediate_size") : cfg.integer("moe_intermediate_size", qwen2 ? 1408 : 768);
  if (F < 1) cfg.bad(mixtral ? "intermediate_size" : "moe_intermediate_size", "must be positive");
  const double aux = cfg.number("router_aux_loss_coef", 0.001);
  if (aux < 0) cfg.bad("router_aux_loss_coef", fmt::format("{}: must not be negative", aux));
  if (mixtral && cfg.number("router_jitter_noise", 0.0) != 0.0)
    cfg.bad("router_jitter_noise",
            fmt::format("{}: Mixtral's jitter scales the experts' input too; mtnlg's (moe_input_jitter_eps) the "
                        "router's alone",
                        cfg.number("router_jitter_noise", 0.0)));
  if (mixtral && cfg.has("sliding_window"))
    cfg.bad("sliding_window",
            fmt::format("{}: sliding-window attention is not built in mtnlg", cfg.j["sliding_window"].dump()));
  if (qwen2 && !cfg.boolean("qkv_bias", true))
    cfg.bad("qkv_bias", "false: mtnlg maps Qwen2-MoE with its q/k/v biases (an export always has them)");
  std::string pattern;
  for (int64_t v : sparse_layers(cfg, kind, L)) pattern += (pattern.empty() ? "" : ", ") + std::to_string(v);
  std::string y = fmt::format(
      ", num_experts: {}, moe_router_topk: {}, moe_ffn_hidden_size: {}, moe_layer_freq: [{}], "
      "moe_router_pre_softmax: {}, moe_router_load_balancing_type: aux_loss, moe_aux_loss_coeff: {}",
      E, k, F, pattern, !renorm, aux);
  if (qwen2) {
    const int64_t S = cfg.integer("shared_expert_intermediate_size", 5632);
    if (S < 1) cfg.bad("shared_expert_intermediate_size", fmt::format("{}: must be positive", S));
    y += fmt::format(", moe_shared_expert_intermediate_size: {}, moe_shared_expert_gate: true", S);
  }
  return y;
}

LlamaKind llama_kind(MoeKind k) {
  return k == MoeKind::mixtral ? LlamaKind::llama : k == MoeKind::qwen2_moe ? LlamaKind::qwen2 : LlamaKind::qwen3;
}

// A given recipe's MoE keys against those config.json implies.
void agree_moe(const std::string& recipe_path, const ModelConfig& m, const ModelConfig& b, const Config& cfg) {
  auto differ = [&](const char* key, const std::string& given, const std::string& implied) {
    if (given != implied)
      throw_input("{}: model.{} is {}, but {} implies {} (its model section must match config.json)", recipe_path, key,
                  given, cfg.path, implied);
  };
  auto str = [](auto v) { return fmt::format("{}", v); };
  const MoeConfig &g = m.moe, &i = b.moe;
  differ("num_experts", str(g.num_experts), str(i.num_experts));
  differ("moe_router_topk", str(g.moe_router_topk), str(i.moe_router_topk));
  differ("moe_ffn_hidden_size", str(expert_width(m)), str(expert_width(b)));
  differ("moe_shared_expert_intermediate_size", str(g.moe_shared_expert_intermediate_size),
         str(i.moe_shared_expert_intermediate_size));
  differ("moe_router_pre_softmax", str(g.moe_router_pre_softmax), str(i.moe_router_pre_softmax));
  for (int64_t l = 0; l < m.num_layers; ++l)
    differ("moe_layer_freq", fmt::format("{} at layer {}", g.is_moe_layer(l) ? "MoE" : "dense", l),
           fmt::format("{} at layer {}", i.is_moe_layer(l) ? "MoE" : "dense", l));
  if (const std::string unfit = moe_unfit(m); !unfit.empty()) throw_input("{}: {}", recipe_path, unfit);
}

}  // namespace

Recipe moe_recipe(const Config& cfg, MoeKind kind, const std::string& recipe_path) {
  const LlamaRecipeExtra extra{moe_keys(cfg, kind), kind == MoeKind::qwen3_moe};
  const Recipe built = llama_recipe(cfg, llama_kind(kind), "", extra);
  if (recipe_path.empty()) return built;
  const Recipe r = llama_recipe(cfg, llama_kind(kind), recipe_path, extra);
  agree_moe(recipe_path, r.model, built.model, cfg);
  return r;
}

void moe_weights(Weights& w, const Recipe& r, MoeKind kind, model::ParamStore& store) {
  const ModelConfig& m = r.model;
  const int64_t C = m.hidden_size, E = m.moe.num_experts, F = expert_width(m),
                S = m.moe.moe_shared_expert_intermediate_size;
  const ProjNames pn = proj_names(kind);
  // `n` floats of HF tensor `t` from offset `at` into parameter `ours` from offset `to`
  auto put = [&](const std::string& ours, int64_t to, const Tensor& t, int64_t at, int64_t n) {
    std::copy_n(t.data<float>() + at, n, store.param(ours).data<float>() + to);
  };
  llama_weights(w, r, store, [&](int64_t l) {
    const std::string p = fmt::format("layers.{}.mlp.", l);
    const bool block_sparse = w.has(moe_prefix(kind, l, true) + "gate.weight");
    const std::string h = moe_prefix(kind, l, block_sparse);
    put(p + "router.weight", 0, w.get(h + "gate.weight", {E, C}), 0, E * C);
    if (w.has(h + "experts.gate_up_proj")) {  // transformers 5: one tensor per layer
      const Tensor gu = w.get(h + "experts.gate_up_proj", {E, 2 * F, C}),
                   dn = w.get(h + "experts.down_proj", {E, C, F});
      for (int64_t e = 0; e < E; ++e) {
        const std::string ours = fmt::format("{}experts.local_experts.{}.", p, e);
        put(ours + "linear_fc1.weight", 0, gu, e * 2 * F * C, 2 * F * C);
        put(ours + "linear_fc2.weight", 0, dn, e * C * F, C * F);
      }
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}experts.{}.", h, e),
                          ours = fmt::format("{}experts.local_experts.{}.", p, e);
        put(ours + "linear_fc1.weight", 0, w.get(x + pn.gate + ".weight", {F, C}), 0, F * C);
        put(ours + "linear_fc1.weight", F * C, w.get(x + pn.up + ".weight", {F, C}), 0, F * C);
        put(ours + "linear_fc2.weight", 0, w.get(x + pn.down + ".weight", {C, F}), 0, C * F);
      }
    }
    if (S == 0) return;
    put(p + "shared_experts.linear_fc1.weight", 0, w.get(h + "shared_expert.gate_proj.weight", {S, C}), 0, S * C);
    put(p + "shared_experts.linear_fc1.weight", S * C, w.get(h + "shared_expert.up_proj.weight", {S, C}), 0, S * C);
    put(p + "shared_experts.linear_fc2.weight", 0, w.get(h + "shared_expert.down_proj.weight", {C, S}), 0, C * S);
    put(p + "shared_experts.gate_weight", 0, w.get(h + "shared_expert_gate.weight", {1, C}), 0, C);
  });
  if (const std::string extra = w.first_unread(); !extra.empty())
    throw_input("{}: tensor '{}' is not one of this {}'s (config.json gives it no place)", w.index_or_single(), extra,
                arch_of(kind));
}

}  // namespace mtnlg::app::hf
