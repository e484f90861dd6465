// Hugging Face GPT-2 (GPT2LMHeadModel): names h.{i}.attn.c_attn.weight..., Conv1D weights
// stored [in, out]. Our QKV rows are per head [q_h | k_h | v_h] (D each); HF's c_attn
// columns are [q (all heads) | k | v], each head-major.
#include <fmt/format.h>

#include "app/checkpoint/hf_families.hpp"
#include "app/process/module_configs.hpp"
#include "core/log.hpp"
#include "core/ops.hpp"

namespace mtnlg::app::hf {

std::string gpt2_unfit(const ModelConfig& m) {
  const char* why = nullptr;
  if (m.rmsnorm())
    why = "model.normalization: RMSNorm";
  else if (m.swiglu)
    why = "model.swiglu: true";
  else if (m.untie_embeddings_and_output_weights)
    why = "model.untie_embeddings_and_output_weights: true";
  else if (!m.add_bias_linear)
    why = "model.add_bias_linear: false";
  else if (m.query_groups() != m.num_attention_heads)
    why = "model.num_query_groups";
  else if (m.kv_channels > 0 && m.kv_channels * m.num_attention_heads != m.hidden_size)
    why = "model.kv_channels";
  else if (m.qk_layernorm)
    why = "model.qk_layernorm: true";
  if (!why) return "";
  return fmt::format(
      "{} with learned absolute positions: Hugging Face's GPT2LMHeadModel (learned positions, "
      "LayerNorm, GELU, tied output, biases) cannot express it, and its LlamaForCausalLM has rotary "
      "positions (model.position_embedding_type: rope)",
      why);
}

Export gpt2_export(const model::LoadedModel& m) {
  const auto& c = m.cfg;
  const int64_t C = c.hidden, H = c.heads, D = C / H, F = c.ffn, V = c.vocab_size, L = c.num_layers_total;
  Export ex;
  auto& out = ex.tensors;
  auto same = [&](const std::string& hf, const std::string& ours) {
    out.push_back({hf, m.store.param(ours).shape(), [&m, ours] { return param_copy(m, ours); }});
  };
  auto conv1d = [&](const std::string& hf, const std::string& ours) {  // [out, in] -> [in, out]
    Shape s = m.store.param(ours).shape();
    out.push_back({hf, {s[1], s[0]}, [&m, ours] { return transpose(m.store.param(ours)); }});
  };
  out.push_back({"wte.weight", {V, C}, [&m, V] { return real_rows(m, "embedding.word_embeddings.weight", V); }});
  same("wpe.weight", "embedding.position_embeddings.weight");
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("layers.{}.", l), h = fmt::format("h.{}.", l);
    same(h + "ln_1.weight", p + "input_layernorm.weight");
    same(h + "ln_1.bias", p + "input_layernorm.bias");
    out.push_back({h + "attn.c_attn.weight", {C, 3 * C}, [&m, p, C, H, D] {
                     Tensor qkv = m.store.param(p + "attention.qkv.weight"), cw = Tensor::empty({C, 3 * C});
                     for (int64_t hd = 0; hd < H; ++hd)
                       for (int64_t part = 0; part < 3; ++part)
                         for (int64_t d = 0; d < D; ++d) {
                           const int64_t ours = hd * 3 * D + part * D + d, theirs = part * C + hd * D + d;
                           for (int64_t i = 0; i < C; ++i)
                             cw.data<float>()[i * 3 * C + theirs] = qkv.data<float>()[ours * C + i];
                         }
                     return cw;
                   }});
    out.push_back({h + "attn.c_attn.bias", {3 * C}, [&m, p, C, H, D] {
                     Tensor qkvb = m.store.param(p + "attention.qkv.bias"), cb = Tensor::empty({3 * C});
                     for (int64_t hd = 0; hd < H; ++hd)
                       for (int64_t part = 0; part < 3; ++part)
                         for (int64_t d = 0; d < D; ++d)
                           cb.data<float>()[part * C + hd * D + d] = qkvb.data<float>()[hd * 3 * D + part * D + d];
                     return cb;
                   }});
    conv1d(h + "attn.c_proj.weight", p + "attention.proj.weight");
    same(h + "attn.c_proj.bias", p + "attention.proj.bias");
    same(h + "ln_2.weight", p + "post_attention_layernorm.weight");
    same(h + "ln_2.bias", p + "post_attention_layernorm.bias");
    conv1d(h + "mlp.c_fc.weight", p + "mlp.fc1.weight");
    same(h + "mlp.c_fc.bias", p + "mlp.fc1.bias");
    conv1d(h + "mlp.c_proj.weight", p + "mlp.fc2.weight");
    same(h + "mlp.c_proj.bias", p + "mlp.fc2.bias");
  }
  same("ln_f.weight", "final_layernorm.weight");
  same("ln_f.bias", "final_layernorm.bias");
  ex.config = {{"architectures", {"GPT2LMHeadModel"}},
               {"model_type", "gpt2"},
               {"vocab_size", V},
               {"n_positions", c.max_positions},
               {"n_ctx", c.max_positions},
               {"n_embd", C},
               {"n_layer", L},
               {"n_head", H},
               {"n_inner", F == 4 * C ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(F)},
               {"activation_function", "gelu_new"},
               {"layer_norm_epsilon", c.layernorm_eps},
               {"initializer_range", c.init_std},
               {"resid_pdrop", 0.0},
               {"embd_pdrop", 0.0},
               {"attn_pdrop", 0.0},
               {"tie_word_embeddings", true}};
  return ex;
}

namespace {

// A Hugging Face GPT-2 directory's dimensions (config.json).
struct Dims {
  int64_t C = 0, L = 0, H = 0, V = 0, P = 0, F = 0;  // hidden, layers, heads, vocab, positions, ffn
};

Dims dims_of(const Config& cfg) {
  Dims d;
  d.C = cfg.integer("n_embd"), d.L = cfg.integer("n_layer"), d.H = cfg.integer("n_head"),
  d.V = cfg.integer("vocab_size"), d.P = cfg.integer("n_positions");
  d.F = cfg.j.contains("n_inner") && cfg.j["n_inner"].is_number_integer() ? cfg.j["n_inner"].get<int64_t>() : 4 * d.C;
  return d;
}

}  // namespace

// config.json's dimensions, and the recipe: the one given (its model section must agree)
// or one built from them.
Recipe gpt2_recipe(const Config& cfg, const std::string& recipe_path) {
  const Dims d = dims_of(cfg);
  Recipe r;
  if (!recipe_path.empty()) {
    r = load_recipe(recipe_path);
  } else {
    std::string y = fmt::format(
        "model: {{num_layers: {}, hidden_size: {}, num_attention_heads: {}, ffn_hidden_size: {}, seq_length: {}, "
        "max_position_embeddings: {}, vocab_size: {}, layernorm_epsilon: {}}}\n"
        "training: {{micro_batch_size: 1, global_batch_size: 1, train_iters: 1}}\ndata: {{mock: true}}\n",
        d.L, d.C, d.H, d.F, d.P, d.P, d.V, cfg.number("layer_norm_epsilon", 1e-5));
    r = parse_recipe(y, cfg.path);
  }
  const std::string unfit = gpt2_unfit(r.model);
  if (!unfit.empty() || r.model.position_embedding_type != PositionEmbedding::learned_absolute)
    throw_input("{}: a GPT-2 model's recipe: {}", recipe_path,
                unfit.empty() ? "model.position_embedding_type must be learned_absolute" : unfit);
  if (r.model.num_layers != d.L || r.model.hidden_size != d.C || r.model.num_attention_heads != d.H ||
      r.model.ffn_hidden_size != d.F || r.model.vocab_size != d.V || r.model.max_position_embeddings != d.P)
    throw_input(
        "{}: recipe model section does not match {} (layers {}, hidden {}, heads {}, ffn {}, vocab {}, positions {})",
        recipe_path, cfg.path, d.L, d.C, d.H, d.F, d.V, d.P);
  return r;
}

// The weights into `store` (one chunk, all layers): Conv1D weights transposed, the fused
// c_attn split into Megatron's per-head [q k v] rows.
void gpt2_weights(Weights& w, const Recipe& r, model::ParamStore& store) {
  const int64_t C = r.model.hidden_size, L = r.model.num_layers, H = r.model.num_attention_heads,
                V = r.model.vocab_size, P = r.model.max_position_embeddings, F = r.model.ffn_hidden_size;
  auto get_t = [&](const std::string& name, Shape shape) -> Tensor {
    const bool prefixed = !w.has(name) && w.has("transformer." + name);
    return w.get(prefixed ? "transformer." + name : name, shape);
  };
  auto put = [&](const std::string& ours, const Tensor& src) {
    Tensor dst = store.param(ours);
    ops::copy(dst, src);
  };
  {
    Tensor we = store.param("embedding.word_embeddings.weight");  // padding rows stay 0
    Tensor head = we.rows(0, V);
    ops::copy(head, get_t("wte.weight", {V, C}));
  }
  put("embedding.position_embeddings.weight", get_t("wpe.weight", {P, C}));
  const int64_t D = C / H;
  for (int64_t l = 0; l < L; ++l) {
    std::string p = fmt::format("layers.{}.", l), h = fmt::format("h.{}.", l);
    put(p + "input_layernorm.weight", get_t(h + "ln_1.weight", {C}));
    put(p + "input_layernorm.bias", get_t(h + "ln_1.bias", {C}));
    Tensor cw = get_t(h + "attn.c_attn.weight", {C, 3 * C}), cb = get_t(h + "attn.c_attn.bias", {3 * C});
    Tensor qkv = store.param(p + "attention.qkv.weight"), qkvb = store.param(p + "attention.qkv.bias");
    for (int64_t hd = 0; hd < H; ++hd)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t k = 0; k < D; ++k) {
          int64_t ours = hd * 3 * D + part * D + k, theirs = part * C + hd * D + k;
          qkvb.data<float>()[ours] = cb.data<float>()[theirs];
          for (int64_t i = 0; i < C; ++i) qkv.data<float>()[ours * C + i] = cw.data<float>()[i * 3 * C + theirs];
        }
    put(p + "attention.proj.weight", transpose(get_t(h + "attn.c_proj.weight", {C, C})));
    put(p + "attention.proj.bias", get_t(h + "attn.c_proj.bias", {C}));
    put(p + "post_attention_layernorm.weight", get_t(h + "ln_2.weight", {C}));
    put(p + "post_attention_layernorm.bias", get_t(h + "ln_2.bias", {C}));
    put(p + "mlp.fc1.weight", transpose(get_t(h + "mlp.c_fc.weight", {C, F})));
    put(p + "mlp.fc1.bias", get_t(h + "mlp.c_fc.bias", {F}));
    put(p + "mlp.fc2.weight", transpose(get_t(h + "mlp.c_proj.weight", {F, C})));
    put(p + "mlp.fc2.bias", get_t(h + "mlp.c_proj.bias", {C}));
  }
  put("final_layernorm.weight", get_t("ln_f.weight", {C}));
  put("final_layernorm.bias", get_t("ln_f.bias", {C}));
}

}  // namespace mtnlg::app::hf
