// Hugging Face Mixtral / Qwen2-MoE / Qwen3-MoE interchange: `checkpoint export` of MoE
// checkpoints gives logits in an independent PyTorch implementation of those classes
// (torch_hf_moe.py) within 1e-5 of mtnlg's; import of an export restores the same weights
// and a second export the same bytes; transformers 5's fused expert tensors import to the
// same weights; every config.json field, tensor or recipe key the other side cannot
// express is exit 2 naming it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/process/module_configs.hpp"
#include "core/safetensors.hpp"
#include "model/checkpoint.hpp"
#include "model/inference.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A tiny Llama-family MoE recipe (3 layers, GQA, untied, no biases, 8 experts, top-2
// renormalised: Mixtral's form) with `over` keys replacing or adding to its model section.
Recipe moe_recipe(const std::map<std::string, std::string>& over) {
  std::map<std::string, std::string> m = {{"num_layers", "3"},
                                          {"hidden_size", "32"},
                                          {"num_attention_heads", "4"},
                                          {"num_query_groups", "2"},
                                          {"ffn_hidden_size", "48"},
                                          {"seq_length", "16"},
                                          {"vocab_size", "300"},
                                          {"make_vocab_size_divisible_by", "128"},
                                          {"position_embedding_type", "rope"},
                                          {"normalization", "RMSNorm"},
                                          {"norm_epsilon", "1.0e-5"},
                                          {"swiglu", "true"},
                                          {"add_bias_linear", "false"},
                                          {"untie_embeddings_and_output_weights", "true"},
                                          {"init_method_std", "0.1"},
                                          {"num_experts", "8"},
                                          {"moe_router_topk", "2"},
                                          {"moe_ffn_hidden_size", "24"},
                                          {"moe_aux_loss_coeff", "0.01"}};
  for (const auto& [k, v] : over) m[k] = v;
  std::string y = "model: {";
  for (const auto& [k, v] : m) y += k + ": " + v + ", ";
  y.resize(y.size() - 2);
  y += "}\ntraining: {micro_batch_size: 1, global_batch_size: 1, train_iters: 1}\ndata: {mock: true}\n";
  return parse_recipe(y, "moe.yaml");
}

// A random model of `r` (norm weights moved off 1) saved as a checkpoint root, with its
// logits for B x T tokens written to REF (as `checkpoint logits` writes them).
model::LoadedModel make_checkpoint(const Recipe& r, const std::string& root, const std::string& ref, int64_t B,
                                   int64_t T, uint64_t seed) {
  model::LoadedModel m = model::make_random_model(app::inference_config(r), seed);
  for (auto& p : m.store.infos())
    if (p.init == model::InitKind::zeros || p.init == model::InitKind::ones)
      for (int64_t i = 0; i < p.numel; ++i)
        m.store.params().data<float>()[p.offset + i] += 0.05f * static_cast<float>(i % 7) - 0.15f;
  app::save_whole_model(root, r, m.store, 0);
  const int64_t V = m.cfg.vocab_size;
  std::vector<int32_t> toks(static_cast<size_t>(B * T));
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 37 + 5) % V);
  auto chunk = model::whole_model_chunk(m.cfg, m.store);
  std::vector<int64_t> rows(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) rows[static_cast<size_t>(i)] = i;
  Tensor logits = model::logits_at(*chunk, toks.data(), B, T, rows);  // [B*T, padded]
  Tensor real = Tensor::empty({B, T, V});
  for (int64_t i = 0; i < B * T; ++i)
    std::copy_n(logits.data<float>() + i * logits.dim(1), V, real.data<float>() + i * V);
  Tensor tt = Tensor::empty({B, T}, DType::i32);
  std::copy(toks.begin(), toks.end(), tt.data<int32_t>());
  safetensors::write(ref, {{"tokens", tt}, {"logits", real}});
  return m;
}

// Every parameter of `a` equals `b`'s bit for bit (the real vocabulary rows of the [V, C] ones).
void require_same_weights(const model::LoadedModel& a, const model::LoadedModel& b) {
  REQUIRE(a.store.numel() == b.store.numel());
  const int64_t V = a.cfg.vocab_size, C = a.cfg.hidden;
  for (auto& p : a.store.infos()) {
    INFO(p.name);
    const Tensor x = a.store.param(p.name), y = b.store.param(p.name);
    const int64_t n = p.vocab_rows ? V * C : p.numel;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += x.data<float>()[i] != y.data<float>()[i];
    REQUIRE(bad == 0);
  }
}

// `from` (an export: transformers 4's per-expert tensors) rewritten into `to` in
// transformers 5's form: per MoE layer mlp.experts.gate_up_proj [E, 2F, H] (each expert's
// gate rows, then its up rows) and mlp.experts.down_proj [E, H, F]; Mixtral's router
// renamed from block_sparse_moe.gate to mlp.gate.
void write_fused(const std::string& from, const std::string& to, bool mixtral) {
  fs::create_directories(to);
  fs::copy_file(from + "/config.json", to + "/config.json", fs::copy_options::overwrite_existing);
  const auto cfg = nlohmann::json::parse(test::read_file(from + "/config.json"));
  const int64_t E = mixtral ? cfg["num_local_experts"].get<int64_t>() : cfg["num_experts"].get<int64_t>();
  const safetensors::File f = safetensors::read(from + "/model.safetensors");
  const char* names[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
  std::vector<safetensors::Entry> out;
  for (const auto& n : f.names)
    if (n.find(".experts.") == std::string::npos || n.find("shared_expert") != std::string::npos) {
      std::string name = n;
      if (auto at = name.find("block_sparse_moe.gate"); at != std::string::npos) name.replace(at, 16, "mlp");
      out.push_back({name, f.tensors.at(n)});
    }
  for (int64_t l = 0; l < cfg["num_hidden_layers"].get<int64_t>(); ++l) {
    const std::string h = fmt::format("model.layers.{}.{}experts.", l, mixtral ? "block_sparse_moe." : "mlp.");
    if (!f.tensors.count(h + "0." + names[0] + ".weight")) continue;  // a dense layer
    const Shape gs = f.tensors.at(h + "0." + names[0] + ".weight").shape();
    const int64_t Fw = gs[0], C = gs[1];
    Tensor gu = Tensor::empty({E, 2 * Fw, C}), dn = Tensor::empty({E, C, Fw});
    for (int64_t e = 0; e < E; ++e) {
      for (int part = 0; part < 2; ++part)
        std::copy_n(f.tensors.at(h + std::to_string(e) + "." + names[part] + ".weight").data<float>(), Fw * C,
                    gu.data<float>() + (e * 2 + part) * Fw * C);
      std::copy_n(f.tensors.at(h + std::to_string(e) + "." + names[2] + ".weight").data<float>(), C * Fw,
                  dn.data<float>() + e * C * Fw);
    }
    out.push_back({fmt::format("model.layers.{}.mlp.experts.gate_up_proj", l), gu});
    out.push_back({fmt::format("model.layers.{}.mlp.experts.down_proj", l), dn});
  }
  safetensors::write(to + "/model.safetensors", out);
}

struct Case {
  std::string name;
  std::map<std::string, std::string> over;
  std::string arch;
};

// Mixtral: every layer MoE, 8 experts top-2 renormalised. Qwen2-MoE: 6 experts top-2 without
// renormalising (pre-softmax), a gated shared expert, q/k/v biases, layer 1 dense (the dense
// layers' own width). Qwen3-MoE: per-head q/k norms of a head size of their own, 4 experts
// top-2 renormalised, layer 0 dense, tied.
const std::vector<Case> kCases = {
    {"mixtral", {}, "MixtralForCausalLM"},
    {"qwen2-moe",
     {{"num_experts", "6"},
      {"moe_ffn_hidden_size", "16"},
      {"moe_router_pre_softmax", "true"},
      {"moe_shared_expert_intermediate_size", "40"},
      {"moe_shared_expert_gate", "true"},
      {"add_qkv_bias", "true"},
      {"moe_layer_freq", "[1, 0, 1]"}},
     "Qwen2MoeForCausalLM"},
    {"qwen3-moe",
     {{"num_experts", "4"},
      {"qk_layernorm", "true"},
      {"kv_channels", "16"},
      {"moe_layer_freq", "[0, 1, 1]"},
      {"untie_embeddings_and_output_weights", "false"}},
     "Qwen3MoeForCausalLM"},
};

}  // namespace

TEST_CASE("checkpoint: Mixtral / Qwen2-MoE / Qwen3-MoE exports match PyTorch; import round-trips bit-exact; fused",
          "[oracle]") {
  if (!test::python_has("torch")) FAIL("Debian's python3-torch is missing (scripts/install-deps.sh installs it)");
  test::TempDir d("hf-moe");
  std::string py_args;
  std::map<std::string, model::LoadedModel> models;
  for (size_t i = 0; i < kCases.size(); ++i) {
    const Case& c = kCases[i];
    const std::string base = d.str() + "/" + c.name;
    models.emplace(c.name,
                   make_checkpoint(moe_recipe(c.over), base + "-ckpt", base + "-ref.safetensors", 2, 9, 11 + i));
    auto ex = test::run_mtnlg("checkpoint export --input " + base + "-ckpt --output " + base + "-hf");
    INFO(ex.out);
    REQUIRE(ex.exit_code == 0);
    const auto cfg = nlohmann::json::parse(test::read_file(base + "-hf/config.json"));
    CHECK(cfg["architectures"][0] == c.arch);
    py_args += " --flip-check " + base + "-hf " + base + "-hf " + base + "-ref.safetensors";
  }
  const auto q2 = nlohmann::json::parse(test::read_file(d.str() + "/qwen2-moe-hf/config.json"));
  CHECK(q2["mlp_only_layers"] == nlohmann::json::array({1}));
  CHECK(q2["norm_topk_prob"] == false);
  CHECK(q2["intermediate_size"] == 48);
  CHECK(q2["moe_intermediate_size"] == 16);
  CHECK(q2["shared_expert_intermediate_size"] == 40);
  auto py =
      test::run_command(test::python() + " " + test::source_dir() + "/test/app/checkpoint/torch_hf_moe.py" + py_args);
  INFO(py.out);
  CHECK(py.exit_code == 0);
  CHECK(py.out.find("PASS") != std::string::npos);

  for (const Case& c : kCases) {
    INFO(c.name);
    const std::string base = d.str() + "/" + c.name;
    // export -> import -> export: the same weights, then the same bytes
    auto im = test::run_mtnlg("checkpoint import --input " + base + "-hf --output " + base + "-back");
    INFO(im.out);
    REQUIRE(im.exit_code == 0);
    require_same_weights(models.at(c.name), app::load_for_inference(base + "-back"));
    auto ex2 = test::run_mtnlg("checkpoint export --input " + base + "-back --output " + base + "-hf2");
    REQUIRE(ex2.exit_code == 0);
    CHECK(test::read_file(base + "-hf2/model.safetensors") == test::read_file(base + "-hf/model.safetensors"));
    CHECK(test::read_file(base + "-hf2/config.json") == test::read_file(base + "-hf/config.json"));
    // transformers 5's fused experts import to the same weights
    write_fused(base + "-hf", base + "-fused", c.name == "mixtral");
    REQUIRE(!safetensors::read(base + "-fused/model.safetensors")
                 .tensors.count("model.layers.2.mlp.experts.0.gate_proj.weight"));
    auto imf = test::run_mtnlg("checkpoint import --input " + base + "-fused --output " + base + "-fused-back");
    INFO(imf.out);
    REQUIRE(imf.exit_code == 0);
    require_same_weights(models.at(c.name), app::load_for_inference(base + "-fused-back"));
    // and export back to transformers 4's per-expert tensors, byte for byte the first export's
    REQUIRE(test::run_mtnlg("checkpoint export --input " + base + "-fused-back --output " + base + "-hf3").exit_code ==
            0);
    CHECK(test::read_file(base + "-hf3/model.safetensors") == test::read_file(base + "-hf/model.safetensors"));
  }
}

// scripts/gpu/hf-check.py --moe (the GPU proof's check against transformers' own MoE
// classes) run here against a stand-in for transformers (transformers_standin/: the
// classes' API over torch_hf_moe.py): its mtnlg command lines and comparisons work, and
// directories written by Python import.
TEST_CASE("checkpoint: hf-check.py --moe runs end to end against a stand-in for transformers", "[oracle]") {
  if (!test::python_has("torch")) FAIL("Debian's python3-torch is missing (scripts/install-deps.sh installs it)");
  test::TempDir d("hf-check-moe");
  const std::string src = test::source_dir();
  auto r = test::run_command("PYTHONPATH=" + src + "/test/app/checkpoint/transformers_standin " + test::python() + " " +
                             src + "/scripts/gpu/hf-check.py --moe " + MTNLG_BINARY + " " + d.str() + "/out");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  size_t passes = 0;
  for (size_t at = r.out.find("\nPASS"); at != std::string::npos; at = r.out.find("\nPASS", at + 1)) ++passes;
  CHECK(passes == 6);  // 3 classes, each imported and re-exported
  CHECK_THAT(r.out, Contains("Qwen2MoeForCausalLM, 24 tokens") && Contains("Qwen3MoeForCausalLM, 24 tokens"));
}

TEST_CASE("checkpoint import/export of MoE: a field, tensor or recipe key the other side cannot take is exit 2",
          "[e2e]") {
  test::TempDir d("hf-moe-bad");
  // The Mixtral and Qwen2-MoE exports to edit.
  std::map<std::string, nlohmann::json> good;
  for (const Case& c : {kCases[0], kCases[1]}) {
    const std::string base = d.str() + "/" + c.name;
    make_checkpoint(moe_recipe(c.over), base + "-ckpt", base + "-ref.safetensors", 1, 2, 3);
    REQUIRE(test::run_mtnlg("checkpoint export --input " + base + "-ckpt --output " + base + "-hf").exit_code == 0);
    good[c.name] = nlohmann::json::parse(test::read_file(base + "-hf/config.json"));
  }
  int n = 0;
  // A copy of export `name` with config.json changed by `edit` and the tensors by `edit_w`;
  // its import must fail naming `what`.
  auto expect_bad = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                        const std::function<void(std::vector<safetensors::Entry>&)>& edit_w, const std::string& what) {
    const std::string dir = d.str() + "/bad" + std::to_string(n++), hf = d.str() + "/" + name + "-hf";
    fs::create_directories(dir);
    nlohmann::json j = good.at(name);
    edit(j);
    test::write_file(dir + "/config.json", j.dump(2));
    const safetensors::File w = safetensors::read(hf + "/model.safetensors");
    std::vector<safetensors::Entry> es;
    for (const auto& t : w.names) es.push_back({t, w.tensors.at(t)});
    edit_w(es);
    safetensors::write(dir + "/model.safetensors", es);
    auto r = test::run_mtnlg("checkpoint import --input " + dir + " --output " + dir + "/out");
    INFO(j.dump() << "\n" << r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Contains(what));
    CHECK(!fs::exists(dir + "/out/latest"));
  };
  auto cfg_bad = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                     const std::string& what) {
    expect_bad(
        name, edit, [](auto&) {}, what);
  };
  auto w_bad = [&](const std::string& name, const std::function<void(std::vector<safetensors::Entry>&)>& edit_w,
                   const std::string& what) {
    expect_bad(
        name, [](auto&) {}, edit_w, what);
  };
  cfg_bad(
      "mixtral", [](auto& j) { j["router_jitter_noise"] = 0.1; }, "config.json: router_jitter_noise: 0.1");
  cfg_bad(
      "mixtral", [](auto& j) { j["sliding_window"] = 4096; }, "config.json: sliding_window: 4096");
  cfg_bad(
      "mixtral", [](auto& j) { j["num_experts_per_tok"] = 9; }, "num_experts_per_tok: 9: not between 1 and");
  cfg_bad(
      "mixtral", [](auto& j) { j["num_experts_per_tok"] = 1; }, "num_experts_per_tok: 1 with renormalised");
  cfg_bad(
      "mixtral", [](auto& j) { j["num_local_experts"] = 0; }, "num_local_experts: 0: must be positive");
  cfg_bad(
      "mixtral", [](auto& j) { j["hidden_act"] = "gelu"; }, "config.json: hidden_act: 'gelu'");
  cfg_bad(
      "mixtral", [](auto& j) { j.erase("rope_theta"); }, "config.json: rope_theta: missing");
  cfg_bad(
      "mixtral", [](auto& j) { j.erase("rms_norm_eps"); }, "config.json: rms_norm_eps: missing");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j.erase("num_key_value_heads"); }, "'num_key_value_heads' missing");
  cfg_bad(
      "mixtral", [](auto& j) { j["model_type"] = "qwen2_moe"; }, "model_type: 'qwen2_moe' does not go with");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["mlp_only_layers"] = {5}; }, "mlp_only_layers: 5: not a layer number");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["mlp_only_layers"] = 1; }, "mlp_only_layers: not a list");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["decoder_sparse_step"] = 0; }, "decoder_sparse_step: 0: must be at least 1");
  cfg_bad(
      "qwen2-moe",
      [](auto& j) {
        j["mlp_only_layers"] = {0, 1, 2};
      },
      "decoder_sparse_step: with mlp_only_layers no layer is MoE");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["shared_expert_intermediate_size"] = 0; },
      "shared_expert_intermediate_size: 0: must be positive");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["qkv_bias"] = false; }, "config.json: qkv_bias: false");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["use_sliding_window"] = true; }, "use_sliding_window: true");
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["router_aux_loss_coef"] = -1.0; }, "router_aux_loss_coef: -1: must not be");
  // config.json and the tensors disagreeing: a width, an expert count
  cfg_bad(
      "qwen2-moe", [](auto& j) { j["moe_intermediate_size"] = 8; },
      "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' has shape [16, 32], expected [8, 32]");
  cfg_bad(
      "mixtral", [](auto& j) { j["num_local_experts"] = 7; },
      "tensor 'model.layers.0.block_sparse_moe.gate.weight' has shape [8, 32], expected [7, 32]");
  auto drop = [](std::vector<safetensors::Entry>& es, const std::string& name) {
    es.erase(std::remove_if(es.begin(), es.end(), [&](auto& e) { return e.name == name; }), es.end());
  };
  w_bad(
      "mixtral", [&](auto& es) { drop(es, "model.layers.1.block_sparse_moe.experts.3.w2.weight"); },
      "tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight' missing");
  w_bad(
      "qwen2-moe", [&](auto& es) { drop(es, "model.layers.2.mlp.shared_expert_gate.weight"); },
      "tensor 'model.layers.2.mlp.shared_expert_gate.weight' missing");
  w_bad(
      "mixtral",
      [&](auto& es) {
        es.push_back({"model.layers.0.block_sparse_moe.experts.8.w1.weight", Tensor::zeros({24, 32})});
      },
      "tensor 'model.layers.0.block_sparse_moe.experts.8.w1.weight' is not one of this MixtralForCausalLM's");
  w_bad(
      "qwen2-moe",
      [&](auto& es) {
        es.push_back({"model.layers.1.mlp.gate.weight", Tensor::zeros({6, 32})});
      },
      "tensor 'model.layers.1.mlp.gate.weight' is not one of this Qwen2MoeForCausalLM's");

  // A recipe that does not match config.json.
  const std::string recipe = d.str() + "/r.yaml";
  test::write_file(recipe, to_yaml(moe_recipe({{"num_experts", "4"}})));
  auto rr = test::run_mtnlg("checkpoint import --input " + d.str() + "/mixtral-hf --output " + d.str() +
                            "/r-out --recipe " + recipe);
  INFO(rr.out);
  CHECK(rr.exit_code == 2);
  CHECK_THAT(rr.out, Contains("model.num_experts is 4") && Contains("implies 8"));
  test::write_file(recipe, to_yaml(moe_recipe(kCases[1].over)));
  auto rl = test::run_mtnlg("checkpoint import --input " + d.str() + "/qwen2-moe-hf --output " + d.str() +
                            "/r-ok --recipe " + recipe);
  INFO(rl.out);
  CHECK(rl.exit_code == 0);

  // Export: a model none of the three classes expresses.
  struct Bad {
    std::map<std::string, std::string> over;
    std::string key;
  };
  const std::vector<Bad> bad = {
      {{{"moe_router_score_function", "sigmoid"}}, "model.moe_router_score_function: sigmoid"},
      {{{"moe_router_num_groups", "2"}, {"moe_router_group_topk", "1"}}, "model.moe_router_group_topk"},
      {{{"moe_router_topk_scaling_factor", "2.5"}}, "model.moe_router_topk_scaling_factor: 2.5"},
      {{{"moe_router_pre_softmax", "true"}}, "model.moe_router_pre_softmax: true without a shared expert"},
      {{{"moe_layer_freq", "2"}}, "model.moe_layer_freq: layer 1 is dense"},
      {{{"add_qkv_bias", "true"}}, "model.add_qkv_bias: true without a shared expert"},
      {{{"moe_shared_expert_intermediate_size", "40"}, {"add_qkv_bias", "true"}},
       "model.moe_shared_expert_gate: false with a shared expert"},
      {{{"moe_shared_expert_intermediate_size", "40"}, {"moe_shared_expert_gate", "true"}},
       "model.add_qkv_bias: false with a shared expert"},
      {{{"moe_shared_expert_intermediate_size", "40"}, {"moe_shared_expert_gate", "true"}, {"qk_layernorm", "true"}},
       "model.moe_shared_expert_intermediate_size with model.qk_layernorm"},
      {{{"position_embedding_type", "learned_absolute"}, {"normalization", "LayerNorm"}, {"swiglu", "false"}},
       "model.num_experts (8) with learned absolute positions"},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string ck = d.str() + "/ck" + std::to_string(i);
    const Recipe r = moe_recipe(bad[i].over);
    app::save_whole_model(ck, r, model::make_random_model(app::inference_config(r), 5).store, 0);
    auto e = test::run_mtnlg("checkpoint export --input " + ck + " --output " + d.str() + "/out" + std::to_string(i));
    INFO(e.out);
    CHECK(e.exit_code == 2);
    CHECK_THAT(e.out, Contains(bad[i].key));
  }
}
