#include "app/checkpoint/checkpoint_tools.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/process/module_configs.hpp"
#include "app/process/preflight.hpp"
#include "app/train/trainer.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "core/ops.hpp"
#include "core/safetensors.hpp"
#include "data/hf_tokenizer.hpp"
#include "model/checkpoint.hpp"
#include "model/partition.hpp"
#include "model/gpt.hpp"

namespace fs = std::filesystem;

namespace mtnlg::app {

namespace {

Recipe recipe_of(const model::ckpt::TrainState& st, const std::string& dir) {
  return parse_recipe(st.recipe_yaml, dir + "/metadata.json");
}

// Declares the parameters (pp_rank, tp_rank) holds under recipe r (all virtual chunks).
void declare_rank(model::ParamStore& store, const Recipe& r, int64_t tp_rank, int64_t pp_rank) {
  model::GptConfig cfg = gpt_config(r);
  for (const auto& s : model::partition_chunks(pipeline_split(r), pp_rank))
    model::declare_chunk_params(store, cfg, s, tp_rank, r.tp());
  store.finalize(DType::f32);
}

// [a, b] -> [b, a] (Hugging Face's Conv1D stores [in, out]; our linear weights [out, in]).
Tensor transpose(const Tensor& w) {
  int64_t a = w.dim(0), b = w.dim(1);
  Tensor t = Tensor::empty({b, a});
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) t.data<float>()[j * a + i] = w.data<float>()[i * b + j];
  return t;
}

}  // namespace

std::string convert_checkpoint(const std::string& in, const std::string& out, int64_t tp, int64_t pp) {
  std::string dir = model::ckpt::resolve(in);
  const auto lock = claim_new_checkpoint_root(out, "--output");
  model::ckpt::TrainState st = model::ckpt::read_metadata(dir);
  Recipe r = recipe_of(st, dir);
  r.parallel.tensor_model_parallel_size = tp;
  r.parallel.pipeline_model_parallel_size = pp;
  r.parallel.pipeline_layers.clear();
  r.parallel.num_layers_per_virtual_pipeline_stage = 0;
  r.parallel.use_distributed_optimizer = false;
  validate(r);  // heads % tp, layers % pp, ... with the target layout
  const std::string part = model::ckpt::partial_dir(out, st.iteration);
  fs::remove_all(part);
  Progress prog("convert", tp * pp, "shards");
  prog.set_secondary_unit("params");
  for (int64_t p = 0; p < pp; ++p)
    for (int64_t t = 0; t < tp; ++t) {
      model::ParamStore store;
      declare_rank(store, r, t, p);
      Tensor m = Tensor::zeros({store.numel()}), vv = Tensor::zeros({store.numel()});
      model::ckpt::OptimShard shard{0, store.numel(), &m, &vv};
      bool has_optim = !fs::exists(dir) ? false : [&] {
        for (auto& e : fs::directory_iterator(dir))
          if (e.path().filename().string().rfind("optim_", 0) == 0) return true;
        return false;
      }();
      model::ckpt::load_into(dir, store, has_optim ? &shard : nullptr, &m, &vv);
      auto snap = model::ckpt::take_snapshot(store, &shard, t, p, 0, true, has_optim);
      model::ckpt::write_snapshot(part, snap);
      prog.add(1, store.numel());
    }
  prog.finish();
  st.layout = {tp, pp, 1, 1, false};
  st.recipe_yaml = to_yaml(r);
  model::ckpt::write_metadata(part, st);
  model::ckpt::commit(out, st.iteration, 0);
  return model::ckpt::iteration_dir(out, st.iteration);
}

std::string save_whole_model(const std::string& root, const Recipe& r, const model::ParamStore& store, int64_t iteration) {
  const std::string part = model::ckpt::partial_dir(root, iteration);
  fs::remove_all(part);
  auto snap = model::ckpt::take_snapshot(store, nullptr, 0, 0, 0, true, false);
  model::ckpt::write_snapshot(part, snap);
  model::ckpt::TrainState st;
  st.iteration = iteration;
  st.seed = static_cast<uint64_t>(r.training.seed);
  Recipe one = r;
  one.parallel.tensor_model_parallel_size = 1;
  one.parallel.pipeline_model_parallel_size = 1;
  one.parallel.pipeline_layers.clear();
  one.parallel.num_layers_per_virtual_pipeline_stage = 0;
  st.recipe_yaml = to_yaml(one);
  model::ckpt::write_metadata(part, st);
  model::ckpt::commit(root, iteration, 0);
  return model::ckpt::iteration_dir(root, iteration);
}

// ---- Hugging Face GPT-2 -------------------------------------------------------------
// Our QKV rows are per head [q_h | k_h | v_h] (D each); HF's c_attn columns are
// [q (all heads) | k | v], each head-major. Conv1D stores weights [in, out].

void export_hf_gpt2(const std::string& in, const std::string& out_dir) {
  model::LoadedModel m = load_for_inference(in);
  const auto& c = m.cfg;
  const int64_t C = c.hidden, H = c.heads, D = C / H, F = c.ffn, V = c.vocab_size, L = c.num_layers_total;
  std::vector<safetensors::Entry> out;
  auto param = [&](const std::string& n) { return m.store.param(n); };
  Tensor wte = Tensor::empty({V, C});
  ops::copy(wte, param("embedding.word_embeddings.weight").rows(0, V));
  out.push_back({"wte.weight", wte});
  out.push_back({"wpe.weight", param("embedding.position_embeddings.weight").clone()});
  for (int64_t l = 0; l < L; ++l) {
    std::string p = fmt::format("layers.{}.", l), h = fmt::format("h.{}.", l);
    out.push_back({h + "ln_1.weight", param(p + "input_layernorm.weight").clone()});
    out.push_back({h + "ln_1.bias", param(p + "input_layernorm.bias").clone()});
    Tensor qkv = param(p + "attention.qkv.weight"), qkvb = param(p + "attention.qkv.bias");
    Tensor cw = Tensor::empty({C, 3 * C}), cb = Tensor::empty({3 * C});
    for (int64_t hd = 0; hd < H; ++hd)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t d = 0; d < D; ++d) {
          int64_t ours = hd * 3 * D + part * D + d, theirs = part * C + hd * D + d;
          cb.data<float>()[theirs] = qkvb.data<float>()[ours];
          for (int64_t i = 0; i < C; ++i) cw.data<float>()[i * 3 * C + theirs] = qkv.data<float>()[ours * C + i];
        }
    out.push_back({h + "attn.c_attn.weight", cw});
    out.push_back({h + "attn.c_attn.bias", cb});
    out.push_back({h + "attn.c_proj.weight", transpose(param(p + "attention.proj.weight"))});
    out.push_back({h + "attn.c_proj.bias", param(p + "attention.proj.bias").clone()});
    out.push_back({h + "ln_2.weight", param(p + "post_attention_layernorm.weight").clone()});
    out.push_back({h + "ln_2.bias", param(p + "post_attention_layernorm.bias").clone()});
    out.push_back({h + "mlp.c_fc.weight", transpose(param(p + "mlp.fc1.weight"))});
    out.push_back({h + "mlp.c_fc.bias", param(p + "mlp.fc1.bias").clone()});
    out.push_back({h + "mlp.c_proj.weight", transpose(param(p + "mlp.fc2.weight"))});
    out.push_back({h + "mlp.c_proj.bias", param(p + "mlp.fc2.bias").clone()});
  }
  out.push_back({"ln_f.weight", param("final_layernorm.weight").clone()});
  out.push_back({"ln_f.bias", param("final_layernorm.bias").clone()});
  fs::create_directories(out_dir);
  safetensors::write(out_dir + "/model.safetensors", out, {{"format", "pt"}});
  nlohmann::ordered_json cfg = {{"architectures", {"GPT2LMHeadModel"}},
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
                                {"tie_word_embeddings", true},
                                {"bos_token_id", 50256},
                                {"eos_token_id", 50256},
                                {"torch_dtype", "float32"}};
  write_file_checked(out_dir + "/config.json", cfg.dump(2) + "\n", "--output");
}

namespace {

// A Hugging Face GPT-2 directory's dimensions (config.json).
struct HfGpt2Dims {
  int64_t C = 0, L = 0, H = 0, V = 0, P = 0, F = 0;  // hidden, layers, heads, vocab, positions, ffn
};

// config.json's dimensions, and the recipe: the one given (its model section must agree)
// or one built from them.
Recipe hf_gpt2_recipe(const std::string& in_dir, const std::string& recipe_path, HfGpt2Dims& d) {
  nlohmann::json cfg;
  {
    std::ifstream f(in_dir + "/config.json");
    if (!f) throw_input("{}/config.json: missing (a Hugging Face GPT-2 directory has config.json and model.safetensors)", in_dir);
    try {
      cfg = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw_input("{}/config.json: not valid JSON: {}", in_dir, e.what());
    }
  }
  auto get = [&](const char* k) -> int64_t {
    if (!cfg.contains(k) || !cfg[k].is_number_integer()) throw_input("{}/config.json: '{}' missing or not an integer", in_dir, k);
    return cfg[k].get<int64_t>();
  };
  d.C = get("n_embd"), d.L = get("n_layer"), d.H = get("n_head"), d.V = get("vocab_size"), d.P = get("n_positions");
  d.F = cfg.contains("n_inner") && cfg["n_inner"].is_number_integer() ? cfg["n_inner"].get<int64_t>() : 4 * d.C;
  Recipe r;
  if (!recipe_path.empty()) {
    r = load_recipe(recipe_path);
  } else {
    std::string y = fmt::format(
        "model: {{num_layers: {}, hidden_size: {}, num_attention_heads: {}, ffn_hidden_size: {}, seq_length: {}, "
        "max_position_embeddings: {}, vocab_size: {}, layernorm_epsilon: {}}}\n"
        "training: {{micro_batch_size: 1, global_batch_size: 1, train_iters: 1}}\ndata: {{mock: true}}\n",
        d.L, d.C, d.H, d.F, d.P, d.P, d.V, cfg.value("layer_norm_epsilon", 1e-5));
    r = parse_recipe(y, in_dir + "/config.json");
  }
  if (r.model.num_layers != d.L || r.model.hidden_size != d.C || r.model.num_attention_heads != d.H ||
      r.model.ffn_hidden_size != d.F || r.model.vocab_size != d.V || r.model.max_position_embeddings != d.P)
    throw_input("{}: recipe model section does not match {}/config.json (layers {}, hidden {}, heads {}, ffn {}, vocab {}, positions {})",
                recipe_path, in_dir, d.L, d.C, d.H, d.F, d.V, d.P);
  return r;
}

// model.safetensors into `store` (one chunk, all layers): Conv1D weights transposed, the
// fused c_attn split into Megatron's per-head [q k v] rows.
void copy_hf_gpt2_weights(const std::string& in_dir, const HfGpt2Dims& d, model::ParamStore& store) {
  const int64_t C = d.C, L = d.L, H = d.H, V = d.V, P = d.P, F = d.F;
  safetensors::File f = safetensors::read(in_dir + "/model.safetensors");
  auto get_t = [&](const std::string& name, Shape shape) -> Tensor {
    std::string n = name;
    if (!f.tensors.count(n) && f.tensors.count("transformer." + n)) n = "transformer." + n;
    auto it = f.tensors.find(n);
    if (it == f.tensors.end()) throw_input("{}/model.safetensors: tensor '{}' missing", in_dir, name);
    Tensor t = it->second;
    if (t.shape() != shape)
      throw_input("{}/model.safetensors: tensor '{}' has shape {}, expected {}", in_dir, name, shape_str(t.shape()), shape_str(shape));
    if (t.dtype() != DType::f32) {
      Tensor x = Tensor::empty(shape);
      ops::convert(x, t);
      t = x;
    }
    return t;
  };
  auto put = [&](const std::string& ours, const Tensor& src) {
    Tensor dst = store.param(ours);
    ops::copy(dst, src);
  };
  {
    Tensor we = store.param("embedding.word_embeddings.weight");  // padding rows stay 0
    Tensor src = get_t("wte.weight", {V, C});
    Tensor head = we.rows(0, V);
    ops::copy(head, src);
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

}  // namespace

std::string import_hf_gpt2(const std::string& in_dir, const std::string& out, const std::string& recipe_path) {
  HfGpt2Dims d;
  const Recipe r = hf_gpt2_recipe(in_dir, recipe_path, d);
  // A tokenizer.json beside the model comes along (with its tokenizer_config.json, which
  // names the EOS): eval and generate find it in the checkpoint root. Checked first, so
  // that a file mtnlg cannot run stops the import before anything is written.
  namespace fs = std::filesystem;
  const fs::path tok_json = fs::path(in_dir) / "tokenizer.json";
  std::error_code ec;
  const bool with_tokenizer = fs::is_regular_file(tok_json, ec);
  if (with_tokenizer) {
    auto tok = data::HfTokenizer::from_file(tok_json.string());
    if (tok->vocab_size() > d.V)
      throw_input("{}: {} token ids, more than the model's vocab_size {} in config.json", tok_json.string(),
                  tok->vocab_size(), d.V);
  }
  const auto lock = claim_new_checkpoint_root(out, "--output");
  model::GptConfig gc = gpt_config(r);
  model::ParamStore store;
  model::declare_chunk_params(store, gc, {0, d.L, true, true, ""}, 0, 1);
  store.finalize(DType::f32);
  copy_hf_gpt2_weights(in_dir, d, store);
  const std::string dir = save_whole_model(out, r, store, 0);
  if (with_tokenizer)
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      if (fs::is_regular_file(fs::path(in_dir) / f, ec))
        fs::copy_file(fs::path(in_dir) / f, fs::path(out) / f, fs::copy_options::overwrite_existing);
  return dir;
}

}  // namespace mtnlg::app
