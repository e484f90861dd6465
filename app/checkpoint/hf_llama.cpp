// Hugging Face Llama (LlamaForCausalLM), Qwen2 (Qwen2ForCausalLM) and Qwen3
// (Qwen3ForCausalLM): rotary positions (rotate-half, Llama 3.1's scaling), RMSNorm,
// SwiGLU, grouped-query attention, tied or untied output; Llama's biases on every linear
// layer or none (attention_bias and mlp_bias together), Qwen2's on q/k/v alone, Qwen3's
// none (its attention_bias would put them on q/k/v/o, which mtnlg does not build) with an
// RMSNorm of each query and key head (q_norm, k_norm: model.qk_layernorm, whose weights
// q_layernorm / k_layernorm copy as they are). Names model.layers.{i}.self_attn.q_proj...,
// nn.Linear weights [out, in] as ours; the fused qkv is split per group (docs/specs/
// interface.md, "Checkpoints").
#include <cmath>
#include <fmt/format.h>

#include "app/checkpoint/hf_families.hpp"
#include "core/log.hpp"
#include "core/ops.hpp"

namespace mtnlg::app::hf {

namespace {

// Llama 3.1's frequency scaling as mtnlg builds it (ops::RopeParams): only `factor` is free.
constexpr double kLowFreqFactor = 1.0, kHighFreqFactor = 4.0, kOriginalPositions = 8192.0;

// Rows of the fused qkv: per group g, its H/G query heads, then its key head, then its
// value head (D rows each). `slot` < H/G: a query head of the group; H/G: k; H/G + 1: v.
struct QkvLayout {
  int64_t H, G, D;
  int64_t per_group() const { return H / G; }
  int64_t row(int64_t g, int64_t slot, int64_t d) const { return (g * (per_group() + 2) + slot) * D + d; }
  // The fused row of row `i` of HF's q_proj (part 0), k_proj (1) or v_proj (2).
  int64_t fused(int part, int64_t i) const {
    const int64_t head = i / D, d = i % D;
    if (part == 0) return row(head / per_group(), head % per_group(), d);
    return row(head, per_group() + (part - 1), d);
  }
  int64_t rows(int part) const { return (part == 0 ? H : G) * D; }
};

constexpr const char* kProj[3] = {"q_proj", "k_proj", "v_proj"};

}  // namespace

std::string llama_unfit(const ModelConfig& m) {
  std::string why;
  if (!m.rope())
    why = "model.position_embedding_type: learned_absolute (Llama, Qwen2 and Qwen3 have rotary positions)";
  else if (!m.rmsnorm())
    why = "model.normalization: LayerNorm with rotary positions (Llama, Qwen2 and Qwen3 have RMSNorm)";
  else if (!m.swiglu)
    why = "model.swiglu: false with rotary positions (the MLP of Llama, Qwen2 and Qwen3 is SwiGLU)";
  else if (m.rotary_interleaved)
    why = "model.rotary_interleaved: true (Llama, Qwen2 and Qwen3 rotate halves)";
  else if (m.rotary_percent != 1.0)
    why = fmt::format("model.rotary_percent: {} (Llama, Qwen2 and Qwen3 rotate every dimension of a head)",
                      m.rotary_percent);
  else if (m.qk_layernorm && (m.add_bias_linear || m.add_qkv_bias))
    why = "model.qk_layernorm with biases (Qwen3's attention_bias covers q, k, v and o together, never the MLP)";
  else if (!m.add_bias_linear && m.add_qkv_bias && m.kv_channels > 0 &&
           m.kv_channels * m.num_attention_heads != m.hidden_size)
    why = "model.kv_channels with model.add_qkv_bias (Qwen2's head size is hidden_size / num_attention_heads)";
  if (why.empty()) return "";
  return why + ": Hugging Face's LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM cannot express it";
}

nlohmann::ordered_json llama_rope_scaling(const ModelConfig& mc) {
  if (!mc.use_rope_scaling) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", mc.rope_scaling_factor},
          {"low_freq_factor", kLowFreqFactor},
          {"high_freq_factor", kHighFreqFactor},
          {"original_max_position_embeddings", static_cast<int64_t>(kOriginalPositions)}};
}

namespace {
// config.json of a Llama-family export: LlamaForCausalLM, Qwen2ForCausalLM for q/k/v
// biases alone, Qwen3ForCausalLM for per-head q/k norms.
nlohmann::ordered_json llama_config(const ModelConfig& mc, const model::GptConfig& c, const QkvLayout& q,
                                    LlamaKind kind) {
  const bool qwen2 = kind == LlamaKind::qwen2, qwen3 = kind == LlamaKind::qwen3;
  const int64_t C = c.hidden, F = c.ffn, V = c.vocab_size, L = c.num_layers_total;
  nlohmann::ordered_json j;
  j["architectures"] = {qwen3 ? "Qwen3ForCausalLM" : qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen3 ? "qwen3" : qwen2 ? "qwen2" : "llama";
  j["vocab_size"] = V;
  j["hidden_size"] = C;
  j["intermediate_size"] = F;
  j["num_hidden_layers"] = L;
  j["num_attention_heads"] = q.H;
  j["num_key_value_heads"] = q.G;
  if (!qwen2) j["head_dim"] = q.D;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_positions;
  j["initializer_range"] = c.init_std;
  j["rms_norm_eps"] = c.layernorm_eps;
  j["rope_theta"] = mc.rotary_base;
  j["rope_scaling"] = llama_rope_scaling(mc);
  if (qwen3) j["attention_bias"] = false;
  if (qwen2 || qwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = L;
  } else {
    j["attention_bias"] = c.bias_linear;
    j["mlp_bias"] = c.bias_linear;
    j["pretraining_tp"] = 1;
  }
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["tie_word_embeddings"] = !c.untied;
  return j;
}
}  // namespace

Export llama_export(const ModelConfig& mc, const model::LoadedModel& m, const MoeLayerOut& moe) {
  const auto& c = m.cfg;
  const int64_t C = c.hidden, V = c.vocab_size, L = c.num_layers_total;
  const QkvLayout q{c.heads, c.kv_groups(), c.head_dim()};
  const LlamaKind kind = c.qk_norm                        ? LlamaKind::qwen3
                         : (!c.bias_linear && c.qkv_bias) ? LlamaKind::qwen2
                                                          : LlamaKind::llama;
  Export ex;
  auto& out = ex.tensors;
  auto same = [&](const std::string& hf, const std::string& ours) {
    out.push_back({hf, m.store.param(ours).shape(), [&m, ours] { return param_copy(m, ours); }});
  };
  out.push_back(
      {"model.embed_tokens.weight", {V, C}, [&m, V] { return real_rows(m, "embedding.word_embeddings.weight", V); }});
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("layers.{}.", l), h = fmt::format("model.layers.{}.", l);
    same(h + "input_layernorm.weight", p + "input_layernorm.weight");
    for (int part = 0; part < 3; ++part) {
      out.push_back({h + "self_attn." + kProj[part] + ".weight", {q.rows(part), C}, [&m, p, q, part, C] {
                       Tensor fused = m.store.param(p + "attention.qkv.weight"), t = Tensor::empty({q.rows(part), C});
                       for (int64_t i = 0; i < q.rows(part); ++i)
                         std::copy_n(fused.data<float>() + q.fused(part, i) * C, C, t.data<float>() + i * C);
                       return t;
                     }});
      if (c.qkv_bias)
        out.push_back({h + "self_attn." + kProj[part] + ".bias", {q.rows(part)}, [&m, p, q, part] {
                         Tensor fused = m.store.param(p + "attention.qkv.bias"), t = Tensor::empty({q.rows(part)});
                         for (int64_t i = 0; i < q.rows(part); ++i)
                           t.data<float>()[i] = fused.data<float>()[q.fused(part, i)];
                         return t;
                       }});
    }
    if (c.qk_norm) {
      same(h + "self_attn.q_norm.weight", p + "attention.q_layernorm.weight");
      same(h + "self_attn.k_norm.weight", p + "attention.k_layernorm.weight");
    }
    same(h + "self_attn.o_proj.weight", p + "attention.proj.weight");
    if (c.bias_linear) same(h + "self_attn.o_proj.bias", p + "attention.proj.bias");
    same(h + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight");
    if (c.moe.is_moe(l)) {
      moe(l, out);
      continue;
    }
    same(h + "mlp.gate_proj.weight", p + "mlp.fc1_gate.weight");
    same(h + "mlp.up_proj.weight", p + "mlp.fc1_up.weight");
    same(h + "mlp.down_proj.weight", p + "mlp.fc2.weight");
    if (c.bias_linear) {
      same(h + "mlp.gate_proj.bias", p + "mlp.fc1_gate.bias");
      same(h + "mlp.up_proj.bias", p + "mlp.fc1_up.bias");
      same(h + "mlp.down_proj.bias", p + "mlp.fc2.bias");
    }
  }
  same("model.norm.weight", "final_layernorm.weight");
  if (c.untied) out.push_back({"lm_head.weight", {V, C}, [&m, V] { return real_rows(m, "output_layer.weight", V); }});

  ex.config = llama_config(mc, c, q, kind);
  return ex;
}

namespace {

// config.json's rotary settings: rope_theta and rope_scaling (transformers 4), or the
// rope_parameters object that holds both (transformers 5).
struct Rope {
  double theta = 10000.0;
  bool scaling = false;
  double factor = 8.0;
};

Rope rope_of(const Config& cfg) {
  Rope r;
  const bool v5 = cfg.has("rope_parameters") && !cfg.has("rope_scaling");
  const std::string key = v5 ? "rope_parameters" : "rope_scaling";
  const nlohmann::json s = cfg.has(key) ? cfg.j[key] : nlohmann::json(nullptr);
  if (!s.is_null() && !s.is_object()) cfg.bad(key, "not an object");
  auto num = [&](const char* f) -> std::optional<double> {
    if (!s.is_object() || !s.contains(f) || s[f].is_null()) return std::nullopt;
    if (!s[f].is_number()) cfg.bad(key + "." + f, "not a number");
    return s[f].get<double>();
  };
  r.theta = cfg.has("rope_theta") ? cfg.number("rope_theta", r.theta) : num("rope_theta").value_or(r.theta);
  if (!(r.theta > 1.0)) cfg.bad(cfg.has("rope_theta") ? "rope_theta" : key + ".rope_theta", "must be > 1");
  const double partial = cfg.has("partial_rotary_factor") ? cfg.number("partial_rotary_factor", 1.0)
                                                          : num("partial_rotary_factor").value_or(1.0);
  if (partial != 1.0)
    cfg.bad(cfg.has("partial_rotary_factor") ? "partial_rotary_factor" : key + ".partial_rotary_factor",
            fmt::format("{}: the Llama family's rotary embedding covers the whole head in mtnlg's import", partial));
  if (!s.is_object()) return r;
  std::string type;
  for (const char* f : {"rope_type", "type"})
    if (s.contains(f) && s[f].is_string()) type = s[f].get<std::string>();
  if (type.empty()) cfg.bad(key + ".rope_type", "missing");
  if (type == "default") return r;
  if (type != "llama3")
    cfg.bad(key + ".rope_type",
            fmt::format("'{}': mtnlg scales rotary frequencies as Llama 3.1 does (llama3) or not at all", type));
  r.scaling = true;
  const auto factor = num("factor");
  if (!factor || *factor < 1.0) cfg.bad(key + ".factor", "missing or < 1");
  r.factor = *factor;
  const std::pair<const char*, double> fixed[] = {{"low_freq_factor", kLowFreqFactor},
                                                  {"high_freq_factor", kHighFreqFactor},
                                                  {"original_max_position_embeddings", kOriginalPositions}};
  for (const auto& [f, want] : fixed) {
    const auto v = num(f);
    if (!v || *v != want)
      cfg.bad(key + "." + f,
              fmt::format("{}: mtnlg's llama3 scaling has Llama 3.1's {} (low_freq_factor 1, high_freq_factor 4, "
                          "original_max_position_embeddings 8192)",
                          v ? fmt::format("{}", *v) : std::string("missing"), want));
  }
  return r;
}

// A recipe key of `given` against the one config.json implies (`says`: the field and its
// value, as the error shows them).
template <class T>
void agree(const std::string& recipe_path, const char* key, T given, T implied, const Config& cfg,
           const std::string& says) {
  if (given != implied)
    throw_input("{}: model.{} is {}, but {} says {} (its model section must match config.json)", recipe_path, key,
                given, cfg.path, says);
}
template <class T>
void agree(const std::string& recipe_path, const char* key, T given, T implied, const Config& cfg, const char* field) {
  agree(recipe_path, key, given, implied, cfg, fmt::format("{} {}", field, implied));
}

}  // namespace

Recipe llama_recipe(const Config& cfg, LlamaKind kind, const std::string& recipe_path, const LlamaRecipeExtra& extra) {
  const bool qwen2 = kind == LlamaKind::qwen2, qwen3 = kind == LlamaKind::qwen3;
  const int64_t C = cfg.integer("hidden_size"), L = cfg.integer("num_hidden_layers"),
                H = cfg.integer("num_attention_heads"), F = cfg.integer("intermediate_size"),
                V = cfg.integer("vocab_size"), P = cfg.integer("max_position_embeddings");
  const int64_t G = cfg.integer("num_key_value_heads", H);
  if (H <= 0) cfg.bad("num_attention_heads", "must be positive");
  if (G <= 0 || H % G != 0)
    cfg.bad("num_key_value_heads", fmt::format("{} does not divide num_attention_heads {}", G, H));
  // Qwen3Config's default head_dim is 128 (Qwen3MoeConfig has none: hidden_size / heads)
  const int64_t D = cfg.integer("head_dim", qwen3 && !extra.head_dim_from_hidden ? 128 : C / H);
  if (cfg.string("hidden_act", "silu") != "silu")
    cfg.bad("hidden_act", fmt::format("'{}': mtnlg's SwiGLU is silu(gate) * up", cfg.string("hidden_act", "")));
  bool bias_linear = false, qkv_bias = false;
  if (qwen2) {
    qkv_bias = true;  // Qwen2: q/k/v biases always, none on o_proj or the MLP
    if (cfg.boolean("use_sliding_window", false))
      cfg.bad("use_sliding_window", "true: sliding-window attention is not built in mtnlg");
  } else if (qwen3) {
    if (cfg.boolean("attention_bias", false))
      cfg.bad("attention_bias", "true: Qwen3's biases on q, k, v and o without the MLP's are not built in mtnlg");
    if (cfg.boolean("use_sliding_window", false))
      cfg.bad("use_sliding_window", "true: sliding-window attention is not built in mtnlg");
  } else {
    const bool ab = cfg.boolean("attention_bias", false), mb = cfg.boolean("mlp_bias", false);
    if (ab != mb)
      cfg.bad(ab ? "attention_bias" : "mlp_bias",
              fmt::format("true with {} false: mtnlg has biases on every linear layer (add_bias_linear) or on q/k/v "
                          "alone (add_qkv_bias), not on the {} alone",
                          ab ? "mlp_bias" : "attention_bias", ab ? "attention's" : "MLP's"));
    bias_linear = ab;
  }
  const bool tied = cfg.boolean("tie_word_embeddings", false);
  const double eps = cfg.number("rms_norm_eps", 1e-6), std_ = cfg.number("initializer_range", 0.02),
               att_drop = cfg.number("attention_dropout", 0.0);
  const Rope rope = rope_of(cfg);
  std::string y = fmt::format(
      "model: {{num_layers: {}, hidden_size: {}, num_attention_heads: {}, num_query_groups: {}, ffn_hidden_size: {}, "
      "kv_channels: {}, seq_length: {}, max_position_embeddings: {}, vocab_size: {}, norm_epsilon: {}, "
      "position_embedding_type: rope, rotary_base: {}, use_rope_scaling: {}, rope_scaling_factor: {}, "
      "normalization: RMSNorm, swiglu: true, untie_embeddings_and_output_weights: {}, add_bias_linear: {}, "
      "add_qkv_bias: {}, qk_layernorm: {}, init_method_std: {}, hidden_dropout: 0.0, attention_dropout: {}{}}}\n"
      "training: {{micro_batch_size: 1, global_batch_size: 1, train_iters: 1}}\ndata: {{mock: true}}\n",
      L, C, H, G, F, D * H == C ? 0 : D, P, P, V, eps, rope.theta, rope.scaling, rope.factor, !tied, bias_linear,
      qkv_bias, qwen3, std_, att_drop, extra.model_yaml);
  const Recipe built = parse_recipe(y, cfg.path);
  if (recipe_path.empty()) return built;
  const Recipe r = load_recipe(recipe_path);
  const ModelConfig &m = r.model, &b = built.model;
  if (const std::string unfit = llama_unfit(m); !unfit.empty()) throw_input("{}: {}", recipe_path, unfit);
  agree(recipe_path, "num_layers", m.num_layers, b.num_layers, cfg, "num_hidden_layers");
  agree(recipe_path, "hidden_size", m.hidden_size, b.hidden_size, cfg, "hidden_size");
  agree(recipe_path, "num_attention_heads", m.num_attention_heads, b.num_attention_heads, cfg, "num_attention_heads");
  agree(recipe_path, "num_query_groups", m.query_groups(), b.query_groups(), cfg, "num_key_value_heads");
  agree(recipe_path, "kv_channels", m.head_dim(), b.head_dim(), cfg, "head_dim");
  bool dense_layers = false;  // without any (Mixtral), ffn_hidden_size is nowhere in the model
  for (int64_t l = 0; l < b.num_layers; ++l) dense_layers |= !b.moe.is_moe_layer(l);
  if (dense_layers)
    agree(recipe_path, "ffn_hidden_size", m.ffn_hidden_size, b.ffn_hidden_size, cfg, "intermediate_size");
  agree(recipe_path, "vocab_size", m.vocab_size, b.vocab_size, cfg, "vocab_size");
  agree(recipe_path, "max_position_embeddings", m.max_position_embeddings, b.max_position_embeddings, cfg,
        "max_position_embeddings");
  agree(recipe_path, "norm_epsilon", m.layernorm_epsilon, b.layernorm_epsilon, cfg, "rms_norm_eps");
  agree(recipe_path, "rotary_base", m.rotary_base, b.rotary_base, cfg, "rope_theta");
  agree(recipe_path, "use_rope_scaling", m.use_rope_scaling, b.use_rope_scaling, cfg,
        std::string(b.use_rope_scaling ? "rope_scaling llama3" : "no rope_scaling"));
  if (b.use_rope_scaling)
    agree(recipe_path, "rope_scaling_factor", m.rope_scaling_factor, b.rope_scaling_factor, cfg, "rope_scaling.factor");
  agree(recipe_path, "untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights,
        b.untie_embeddings_and_output_weights, cfg, fmt::format("tie_word_embeddings {}", tied));
  const std::string biases = qwen2   ? std::string("model_type qwen2 (biases on q/k/v alone)")
                             : qwen3 ? std::string("model_type qwen3 (no biases)")
                                     : fmt::format("attention_bias {}, mlp_bias {}", bias_linear, bias_linear);
  agree(recipe_path, "add_bias_linear", m.add_bias_linear, b.add_bias_linear, cfg, biases);
  agree(recipe_path, "add_qkv_bias", m.qkv_bias(), b.qkv_bias(), cfg, biases);
  agree(recipe_path, "qk_layernorm", m.qk_layernorm, b.qk_layernorm, cfg,
        fmt::format("model_type {} ({} per-head q/k norms)", cfg.string("model_type", ""), qwen3 ? "with" : "without"));
  return r;
}

void llama_weights(Weights& w, const Recipe& r, model::ParamStore& store, const MoeLayerIn& moe) {
  const ModelConfig& m = r.model;
  const int64_t C = m.hidden_size, L = m.num_layers, F = m.ffn_hidden_size, V = m.vocab_size;
  const QkvLayout q{m.num_attention_heads, m.query_groups(), m.head_dim()};
  auto put = [&](const std::string& ours, const std::string& hf, const Shape& shape) {
    Tensor dst = store.param(ours);
    ops::copy(dst, w.get(hf, shape));
  };
  auto put_rows = [&](const std::string& ours, const std::string& hf) {  // padding rows stay 0
    Tensor head = store.param(ours).rows(0, V);
    ops::copy(head, w.get(hf, {V, C}));
  };
  put_rows("embedding.word_embeddings.weight", "model.embed_tokens.weight");
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("layers.{}.", l), h = fmt::format("model.layers.{}.", l);
    put(p + "input_layernorm.weight", h + "input_layernorm.weight", {C});
    Tensor qkv = store.param(p + "attention.qkv.weight");
    for (int part = 0; part < 3; ++part) {
      const std::string name = h + "self_attn." + kProj[part];
      Tensor t = w.get(name + ".weight", {q.rows(part), C});
      for (int64_t i = 0; i < q.rows(part); ++i)
        std::copy_n(t.data<float>() + i * C, C, qkv.data<float>() + q.fused(part, i) * C);
      if (m.qkv_bias()) {
        Tensor b = w.get(name + ".bias", {q.rows(part)}), qkvb = store.param(p + "attention.qkv.bias");
        for (int64_t i = 0; i < q.rows(part); ++i) qkvb.data<float>()[q.fused(part, i)] = b.data<float>()[i];
      }
    }
    if (m.qk_layernorm) {
      put(p + "attention.q_layernorm.weight", h + "self_attn.q_norm.weight", {q.D});
      put(p + "attention.k_layernorm.weight", h + "self_attn.k_norm.weight", {q.D});
    }
    put(p + "attention.proj.weight", h + "self_attn.o_proj.weight", {C, q.H * q.D});
    if (m.add_bias_linear) put(p + "attention.proj.bias", h + "self_attn.o_proj.bias", {C});
    put(p + "post_attention_layernorm.weight", h + "post_attention_layernorm.weight", {C});
    if (m.moe.is_moe_layer(l)) {
      moe(l);
      continue;
    }
    put(p + "mlp.fc1_gate.weight", h + "mlp.gate_proj.weight", {F, C});
    put(p + "mlp.fc1_up.weight", h + "mlp.up_proj.weight", {F, C});
    put(p + "mlp.fc2.weight", h + "mlp.down_proj.weight", {C, F});
    if (m.add_bias_linear) {
      put(p + "mlp.fc1_gate.bias", h + "mlp.gate_proj.bias", {F});
      put(p + "mlp.fc1_up.bias", h + "mlp.up_proj.bias", {F});
      put(p + "mlp.fc2.bias", h + "mlp.down_proj.bias", {C});
    }
  }
  put("final_layernorm.weight", "model.norm.weight", {C});
  if (m.untie_embeddings_and_output_weights) put_rows("output_layer.weight", "lm_head.weight");
}

}  // namespace mtnlg::app::hf
