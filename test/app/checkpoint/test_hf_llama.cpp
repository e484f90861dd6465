// Hugging Face Llama / Qwen2 / Qwen3 interchange: `checkpoint export` of Llama-family
// checkpoints gives logits in an independent PyTorch implementation of LlamaForCausalLM /
// Qwen2ForCausalLM / Qwen3ForCausalLM (torch_hf_llama.py) equal to mtnlg's; import of an export restores the
// same weights and a second export the same bytes; sharded and bf16 exports; every
// config.json field (and recipe key) the other side cannot express is exit 2 naming it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/process/module_configs.hpp"
#include "core/ops.hpp"
#include "core/safetensors.hpp"
#include "model/checkpoint.hpp"
#include "model/inference.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A tiny Llama recipe (GQA: 4 query heads in 2 groups, untied, no biases) with `over` keys
// replacing or adding to its model section.
Recipe llama_recipe(const std::map<std::string, std::string>& over) {
  std::map<std::string, std::string> m = {{"num_layers", "2"},
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
                                          {"init_method_std", "0.1"}};
  for (const auto& [k, v] : over) m[k] = v;
  std::string y = "model: {";
  for (const auto& [k, v] : m) y += k + ": " + v + ", ";
  y.resize(y.size() - 2);
  y += "}\ntraining: {micro_batch_size: 1, global_batch_size: 1, train_iters: 1}\ndata: {mock: true}\n";
  return parse_recipe(y, "llama.yaml");
}

// A random model of `r` (norm weights and biases moved off 1 and 0) saved as a checkpoint
// root, with its logits for B x T tokens written to REF (as `checkpoint logits` writes them).
model::LoadedModel make_checkpoint(const Recipe& r, const std::string& root, const std::string& ref, int64_t B,
                                   int64_t T, uint64_t seed) {
  model::LoadedModel m = model::make_random_model(app::gpt_config(r), seed);
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

// Every parameter of `a` equals `b`'s (the real vocabulary rows of the [V, C] ones); with
// `bf16`, `a`'s rounded to bf16 as an export in bf16 rounds them.
void require_same_weights(const model::LoadedModel& a, const model::LoadedModel& b, bool bf16 = false) {
  REQUIRE(a.store.numel() == b.store.numel());
  const int64_t V = a.cfg.vocab_size, C = a.cfg.hidden;
  for (auto& p : a.store.infos()) {
    INFO(p.name);
    Tensor x = a.store.param(p.name), y = b.store.param(p.name);
    if (bf16) {
      Tensor h = Tensor::empty(x.shape(), DType::bf16), back = Tensor::empty(x.shape());
      ops::convert(h, x);
      ops::convert(back, h);
      x = back;
    }
    const int64_t n = p.vocab_rows ? V * C : p.numel;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += x.data<float>()[i] != y.data<float>()[i];
    REQUIRE(bad == 0);
  }
}

std::string slurp(const fs::path& p) { return test::read_file(p); }

}  // namespace

TEST_CASE("checkpoint: Llama / Qwen2 / Qwen3 exports match PyTorch; import round-trips bit-exact; shards; bf16",
          "[oracle]") {
  if (!test::python_has("torch")) FAIL("Debian's python3-torch is missing (scripts/install-deps.sh installs it)");
  test::TempDir d("hf-llama");
  struct Case {
    std::string name;
    std::map<std::string, std::string> over;
    int64_t B, T;
    std::string arch;
  };
  const std::vector<Case> cases = {
      {"gqa-untied", {}, 2, 9, "LlamaForCausalLM"},
      {"tied", {{"untie_embeddings_and_output_weights", "false"}}, 2, 9, "LlamaForCausalLM"},
      // Llama 3.1's scaling over 128 positions with rotary_base 1e6: of the 4 frequencies of a
      // head of 8, one is blended and one divided by the factor (the script checks they matter)
      {"rope-scaling",
       {{"use_rope_scaling", "true"}, {"rope_scaling_factor", "8"}, {"rotary_base", "1000000"}, {"seq_length", "128"}},
       1,
       128,
       "LlamaForCausalLM"},
      {"qwen2", {{"add_qkv_bias", "true"}, {"untie_embeddings_and_output_weights", "false"}}, 2, 9, "Qwen2ForCausalLM"},
      {"biases", {{"add_bias_linear", "true"}}, 2, 9, "LlamaForCausalLM"},
      {"mqa-head-dim", {{"num_query_groups", "1"}, {"kv_channels", "16"}}, 2, 9, "LlamaForCausalLM"},
      // Qwen3: per-head q/k norms, a head size of its own, tied
      {"qwen3",
       {{"qk_layernorm", "true"}, {"kv_channels", "16"}, {"untie_embeddings_and_output_weights", "false"}},
       2,
       9,
       "Qwen3ForCausalLM"},
  };
  std::string py_args;
  std::map<std::string, model::LoadedModel> models;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string base = d.str() + "/" + c.name;
    models.emplace(c.name,
                   make_checkpoint(llama_recipe(c.over), base + "-ckpt", base + "-ref.safetensors", c.B, c.T, 7 + i));
    auto ex = test::run_mtnlg("checkpoint export --input " + base + "-ckpt --output " + base + "-hf");
    INFO(ex.out);
    REQUIRE(ex.exit_code == 0);
    const auto cfg = nlohmann::json::parse(slurp(base + "-hf/config.json"));
    CHECK(cfg["architectures"][0] == c.arch);
    CHECK(cfg["torch_dtype"] == "float32");
    py_args += " " + base + "-hf " + base + "-ref.safetensors";
    if (c.name == "rope-scaling") py_args += " --no-scaling-check " + base + "-hf";
  }
  const std::string g = d.str() + "/gqa-untied";
  // Sharded: 20 KB shards of the untied GQA model (about 110 KB), with the given token ids.
  auto sh = test::run_mtnlg("checkpoint export --input " + g + "-ckpt --output " + g +
                            "-shards --max-shard-size 20KB --bos-token-id 1 --eos-token-id 2");
  INFO(sh.out);
  REQUIRE(sh.exit_code == 0);
  const auto index = nlohmann::json::parse(slurp(g + "-shards/model.safetensors.index.json"));
  std::set<std::string> shard_files;
  for (auto& [k, v] : index["weight_map"].items()) shard_files.insert(v.get<std::string>());
  CHECK(shard_files.size() > 3);
  CHECK(shard_files.count(fmt::format("model-00001-of-{:05d}.safetensors", shard_files.size())) == 1);
  CHECK(!fs::exists(g + "-shards/model.safetensors"));
  int64_t total = 0;
  for (const auto& f : shard_files) {
    int64_t bytes = 0;
    const auto part = safetensors::read(g + "-shards/" + f);
    for (auto& [name, t] : part.tensors) bytes += t.nbytes();
    INFO(f);
    CHECK((bytes <= 20000 || part.tensors.size() == 1));  // 20 KB, or one tensor larger than that
    total += bytes;
  }
  CHECK(index["metadata"]["total_size"] == total);
  const auto shard_cfg = nlohmann::json::parse(slurp(g + "-shards/config.json"));
  CHECK(shard_cfg["bos_token_id"] == 1);
  CHECK(shard_cfg["eos_token_id"] == 2);
  py_args += " " + g + "-shards " + g + "-ref.safetensors";
  // bf16 weights: PyTorch on the rounded weights against mtnlg's fp32 logits, loosely
  auto bf = test::run_mtnlg("checkpoint export --dtype bf16 --input " + g + "-ckpt --output " + g + "-bf16");
  INFO(bf.out);
  REQUIRE(bf.exit_code == 0);
  CHECK(nlohmann::json::parse(slurp(g + "-bf16/config.json"))["torch_dtype"] == "bfloat16");
  CHECK(safetensors::read(g + "-bf16/model.safetensors").tensors.at("lm_head.weight").dtype() == DType::bf16);
  py_args += " " + g + "-bf16 " + g + "-ref.safetensors 5e-2";

  auto py =
      test::run_command(test::python() + " " + test::source_dir() + "/test/app/checkpoint/torch_hf_llama.py" + py_args);
  INFO(py.out);
  CHECK(py.exit_code == 0);
  CHECK(py.out.find("PASS") != std::string::npos);

  // export -> import -> export: the same weights, then the same bytes
  for (const Case& c : cases) {
    INFO(c.name);
    const std::string base = d.str() + "/" + c.name;
    auto im = test::run_mtnlg("checkpoint import --input " + base + "-hf --output " + base + "-back");
    INFO(im.out);
    REQUIRE(im.exit_code == 0);
    require_same_weights(models.at(c.name), app::load_for_inference(base + "-back"));
    auto ex2 = test::run_mtnlg("checkpoint export --input " + base + "-back --output " + base + "-hf2");
    REQUIRE(ex2.exit_code == 0);
    CHECK(slurp(base + "-hf2/model.safetensors") == slurp(base + "-hf/model.safetensors"));
    CHECK(slurp(base + "-hf2/config.json") == slurp(base + "-hf/config.json"));
  }
  // an export does not depend on the checkpoint's layout: the import rewritten for tp 2 x pp 2
  // (query groups, gate/up, vocabulary split over tp; Qwen3's q/k norm weights replicated)
  // exports the same bytes
  for (const std::string& name : {std::string("gqa-untied"), std::string("qwen3")}) {
    INFO(name);
    const std::string base = d.str() + "/" + name;
    auto cv =
        test::run_mtnlg("checkpoint convert --input " + base + "-back --output " + base + "-tp2pp2 --tp 2 --pp 2");
    INFO(cv.out);
    REQUIRE(cv.exit_code == 0);
    REQUIRE(test::run_mtnlg("checkpoint export --input " + base + "-tp2pp2 --output " + base + "-hf3").exit_code == 0);
    CHECK(slurp(base + "-hf3/model.safetensors") == slurp(base + "-hf/model.safetensors"));
  }
  // the shards import to the same model; its re-export keeps the token ids (hf_config.json)
  auto ims = test::run_mtnlg("checkpoint import --input " + g + "-shards --output " + g + "-shards-back");
  INFO(ims.out);
  REQUIRE(ims.exit_code == 0);
  require_same_weights(models.at("gqa-untied"), app::load_for_inference(g + "-shards-back"));
  REQUIRE(test::run_mtnlg("checkpoint export --input " + g + "-shards-back --output " + g + "-one").exit_code == 0);
  CHECK(slurp(g + "-one/model.safetensors") == slurp(g + "-hf/model.safetensors"));
  CHECK(nlohmann::json::parse(slurp(g + "-one/config.json"))["eos_token_id"] == 2);
  // bf16 imports as the rounded weights
  auto imb = test::run_mtnlg("checkpoint import --input " + g + "-bf16 --output " + g + "-bf16-back");
  INFO(imb.out);
  REQUIRE(imb.exit_code == 0);
  require_same_weights(models.at("gqa-untied"), app::load_for_inference(g + "-bf16-back"), true);
  // and F16 weights are read too (written here from the fp32 export)
  fs::create_directories(g + "-f16");
  fs::copy_file(g + "-hf/config.json", g + "-f16/config.json");
  {
    safetensors::File f = safetensors::read(g + "-hf/model.safetensors");
    std::vector<safetensors::Entry> half;
    for (const auto& n : f.names) {
      Tensor h = Tensor::empty(f.tensors.at(n).shape(), DType::f16);
      ops::convert(h, f.tensors.at(n));
      half.push_back({n, h});
    }
    safetensors::write(g + "-f16/model.safetensors", half);
  }
  auto imh = test::run_mtnlg("checkpoint import --input " + g + "-f16 --output " + g + "-f16-back");
  INFO(imh.out);
  REQUIRE(imh.exit_code == 0);
  const model::LoadedModel h = app::load_for_inference(g + "-f16-back");
  const Tensor a = models.at("gqa-untied").store.param("final_layernorm.weight"),
               b = h.store.param("final_layernorm.weight");
  for (int64_t i = 0; i < a.numel(); ++i)
    CHECK(std::abs(a.data<float>()[i] - b.data<float>()[i]) <= 1e-3f * std::abs(a.data<float>()[i]));
}

TEST_CASE("checkpoint import: a config.json field or file mtnlg cannot take is exit 2 naming it", "[e2e]") {
  test::TempDir d("hf-llama-bad");
  const std::string ck = d.str() + "/ckpt", hf = d.str() + "/hf";
  make_checkpoint(llama_recipe({}), ck, d.str() + "/ref.safetensors", 1, 2, 3);
  REQUIRE(test::run_mtnlg("checkpoint export --input " + ck + " --output " + hf).exit_code == 0);
  const nlohmann::json good = nlohmann::json::parse(slurp(hf + "/config.json"));
  int n = 0;
  // A copy of the export with config.json changed by `edit`; its import must fail naming `field`.
  auto expect_bad = [&](const std::function<void(nlohmann::json&)>& edit, const std::vector<std::string>& field) {
    const std::string dir = d.str() + "/bad" + std::to_string(n++);
    fs::create_directories(dir);
    fs::copy_file(hf + "/model.safetensors", dir + "/model.safetensors");
    nlohmann::json j = good;
    edit(j);
    test::write_file(dir + "/config.json", j.dump(2));
    auto r = test::run_mtnlg("checkpoint import --input " + dir + " --output " + dir + "/out");
    INFO(j.dump() << "\n" << r.out);
    CHECK(r.exit_code == 2);
    for (const auto& f : field) CHECK_THAT(r.out, Contains(f));
    CHECK(!fs::exists(dir + "/out/latest"));
  };
  auto llama3 = [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  };
  expect_bad([](auto& j) { j["hidden_act"] = "gelu"; }, {"config.json: hidden_act: 'gelu'"});
  expect_bad(
      [](auto& j) {
        j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
      },
      {"rope_scaling.rope_type: 'yarn'"});
  expect_bad(
      [&](auto& j) {
        llama3(j);
        j["rope_scaling"]["low_freq_factor"] = 2.0;
      },
      {"rope_scaling.low_freq_factor: 2"});
  expect_bad(
      [&](auto& j) {
        llama3(j);
        j["rope_scaling"]["high_freq_factor"] = 8.0;
      },
      {"rope_scaling.high_freq_factor: 8"});
  expect_bad(
      [&](auto& j) {
        llama3(j);
        j["rope_scaling"]["original_max_position_embeddings"] = 4096;
      },
      {"rope_scaling.original_max_position_embeddings: 4096"});
  expect_bad(
      [&](auto& j) {
        llama3(j);
        j["rope_scaling"].erase("factor");
      },
      {"rope_scaling.factor: missing"});
  expect_bad([](auto& j) { j["rope_scaling"] = 5; }, {"rope_scaling: not an object"});
  expect_bad([](auto& j) { j["attention_bias"] = true; }, {"attention_bias: true with mlp_bias false"});
  expect_bad([](auto& j) { j["mlp_bias"] = true; }, {"mlp_bias: true with attention_bias false"});
  expect_bad([](auto& j) { j["partial_rotary_factor"] = 0.5; }, {"partial_rotary_factor: 0.5"});
  expect_bad([](auto& j) { j["num_key_value_heads"] = 3; }, {"num_key_value_heads: 3 does not divide"});
  expect_bad([](auto& j) { j.erase("hidden_size"); }, {"'hidden_size' missing"});
  expect_bad([](auto& j) { j["intermediate_size"] = "48"; }, {"'intermediate_size' missing or not an integer"});
  expect_bad([](auto& j) { j["rope_theta"] = 0.5; }, {"rope_theta: must be > 1"});
  expect_bad([](auto& j) { j["tie_word_embeddings"] = "yes"; }, {"tie_word_embeddings: not true or false"});
  expect_bad(
      [](auto& j) {
        j["architectures"] = {"Olmo2ForCausalLM"};  // its q/k norms span all heads at once
        j["model_type"] = "olmo2";
      },
      {"architectures: 'Olmo2ForCausalLM'"});
  expect_bad(
      [](auto& j) {
        j.erase("architectures");
        j["model_type"] = "olmo2";
      },
      {"model_type: 'olmo2' (and no architectures)"});
  expect_bad(
      [](auto& j) {
        j["architectures"] = {"Qwen3ForCausalLM"};
        j["model_type"] = "qwen3";
        j["attention_bias"] = true;
      },
      {"attention_bias: true: Qwen3's biases"});
  expect_bad(
      [](auto& j) {
        j["architectures"] = {"MistralForCausalLM"};
        j["model_type"] = "mistral";
      },
      {"architectures: 'MistralForCausalLM'"});
  expect_bad([](auto& j) { j["model_type"] = "qwen2"; }, {"model_type: 'qwen2' does not go with architectures"});
  expect_bad(
      [](auto& j) {
        j["architectures"] = {"Qwen2ForCausalLM"};
        j["model_type"] = "qwen2";
        j["use_sliding_window"] = true;
      },
      {"use_sliding_window: true"});
  // transformers 5's rope_parameters is read like rope_theta + rope_scaling
  {
    const std::string dir = d.str() + "/v5";
    fs::create_directories(dir);
    fs::copy_file(hf + "/model.safetensors", dir + "/model.safetensors");
    nlohmann::json j = good;
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                            {"factor", 32.0},          {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    test::write_file(dir + "/config.json", j.dump(2));
    auto r = test::run_mtnlg("checkpoint import --input " + dir + " --output " + dir + "/out");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    auto st = model::ckpt::read_metadata(model::ckpt::resolve(dir + "/out"));
    Recipe rr = parse_recipe(st.recipe_yaml, "metadata.json");
    CHECK(rr.model.rotary_base == 500000.0);
    CHECK(rr.model.use_rope_scaling);
    CHECK(rr.model.rope_scaling_factor == 32.0);
  }

  // The weights: a tensor missing, of another shape or dtype; the shards' index wrong.
  const safetensors::File w = safetensors::read(hf + "/model.safetensors");
  auto expect_bad_weights = [&](const std::function<void(std::vector<safetensors::Entry>&, const std::string&)>& edit,
                                const std::vector<std::string>& what) {
    const std::string dir = d.str() + "/badw" + std::to_string(n++);
    fs::create_directories(dir);
    fs::copy_file(hf + "/config.json", dir + "/config.json");
    std::vector<safetensors::Entry> es;
    for (const auto& name : w.names) es.push_back({name, w.tensors.at(name)});
    edit(es, dir);
    if (!es.empty()) safetensors::write(dir + "/model.safetensors", es);
    auto r = test::run_mtnlg("checkpoint import --input " + dir + " --output " + dir + "/out");
    INFO(r.out);
    CHECK(r.exit_code == 2);
    for (const auto& f : what) CHECK_THAT(r.out, Contains(f));
  };
  auto drop = [](std::vector<safetensors::Entry>& es, const std::string& name) {
    es.erase(std::remove_if(es.begin(), es.end(), [&](auto& e) { return e.name == name; }), es.end());
  };
  expect_bad_weights([&](auto& es, auto&) { drop(es, "lm_head.weight"); },
                     {"model.safetensors: tensor 'lm_head.weight' missing"});
  expect_bad_weights([&](auto& es, auto&) { drop(es, "model.layers.1.self_attn.k_proj.weight"); },
                     {"tensor 'model.layers.1.self_attn.k_proj.weight' missing"});
  expect_bad_weights(
      [&](auto& es, auto&) {
        for (auto& e : es)
          if (e.name == "model.norm.weight") e.tensor = Tensor::zeros({31});
      },
      {"tensor 'model.norm.weight' has shape [31], expected [32]"});
  expect_bad_weights(
      [&](auto& es, auto&) {
        for (auto& e : es)
          if (e.name == "model.norm.weight") e.tensor = Tensor::zeros({32}, DType::i32);
      },
      {"tensor 'model.norm.weight' is I32, expected F32, BF16 or F16"});
  expect_bad_weights([&](auto& es, auto&) { es.clear(); },
                     {"neither model.safetensors nor model.safetensors.index.json"});
  expect_bad_weights(
      [&](auto& es, const std::string& dir) {
        nlohmann::json map;
        for (auto& e : es) map[e.name] = "model-00001-of-00002.safetensors";
        map["model.norm.weight"] = "model-00002-of-00002.safetensors";
        test::write_file(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", map}}.dump());
        safetensors::write(dir + "/model-00001-of-00002.safetensors", es);
        es.clear();
      },
      {"model-00002-of-00002.safetensors: cannot open"});
  expect_bad_weights(
      [&](auto& es, const std::string& dir) {
        test::write_file(dir + "/model.safetensors.index.json",
                         nlohmann::json{{"weight_map", {{"model.norm.weight", "../model.safetensors"}}}}.dump());
        es.clear();
      },
      {"weight_map.model.norm.weight: not a file name"});

  // A recipe that does not match config.json; the GPT-2-only format.
  const std::string recipe = d.str() + "/r.yaml";
  test::write_file(recipe, to_yaml(llama_recipe({{"num_query_groups", "4"}})));
  auto rr = test::run_mtnlg("checkpoint import --input " + hf + " --output " + d.str() + "/r-out --recipe " + recipe);
  INFO(rr.out);
  CHECK(rr.exit_code == 2);
  CHECK_THAT(rr.out, Contains("model.num_query_groups is 4") && Contains("num_key_value_heads 2"));
  test::write_file(recipe, to_yaml(llama_recipe({})));
  auto ok = test::run_mtnlg("checkpoint import --input " + hf + " --output " + d.str() + "/r-ok --recipe " + recipe);
  INFO(ok.out);
  CHECK(ok.exit_code == 0);
  auto g2 = test::run_mtnlg("checkpoint import --format hf-gpt2 --input " + hf + " --output " + d.str() + "/g2");
  CHECK(g2.exit_code == 2);
  CHECK_THAT(g2.out, Contains("--format hf-gpt2") && Contains("not a GPT-2 model"));
}

TEST_CASE("checkpoint export: a model Hugging Face's classes cannot express is exit 2 naming the recipe key", "[e2e]") {
  test::TempDir d("hf-llama-unfit");
  struct Bad {
    std::map<std::string, std::string> over;
    std::string key;
  };
  const std::vector<Bad> bad = {
      {{{"normalization", "LayerNorm"}}, "model.normalization: LayerNorm with rotary positions"},
      {{{"swiglu", "false"}, {"ffn_hidden_size", "128"}}, "model.swiglu: false"},
      {{{"rotary_interleaved", "true"}}, "model.rotary_interleaved: true"},
      {{{"rotary_percent", "0.5"}}, "model.rotary_percent: 0.5"},
      {{{"position_embedding_type", "learned_absolute"}},
       "model.normalization: RMSNorm with learned absolute positions"},
      {{{"position_embedding_type", "learned_absolute"},
        {"normalization", "LayerNorm"},
        {"swiglu", "false"},
        {"ffn_hidden_size", "128"}},
       "model.untie_embeddings_and_output_weights: true with learned absolute positions"},
      {{{"add_qkv_bias", "true"}, {"kv_channels", "16"}}, "model.kv_channels with model.add_qkv_bias"},
      {{{"qk_layernorm", "true"}, {"add_qkv_bias", "true"}}, "model.qk_layernorm with biases"},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string ck = d.str() + "/ck" + std::to_string(i);
    const Recipe r = llama_recipe(bad[i].over);
    app::save_whole_model(ck, r, model::make_random_model(app::gpt_config(r), 5).store, 0);
    auto e = test::run_mtnlg("checkpoint export --input " + ck + " --output " + d.str() + "/out" + std::to_string(i));
    INFO(e.out);
    CHECK(e.exit_code == 2);
    CHECK_THAT(e.out, Contains(bad[i].key));
  }
  const std::string ck = d.str() + "/llama";
  const Recipe r = llama_recipe({});
  app::save_whole_model(ck, r, model::make_random_model(app::gpt_config(r), 5).store, 0);
  auto g = test::run_mtnlg("checkpoint export --format hf-gpt2 --input " + ck + " --output " + d.str() + "/g");
  CHECK(g.exit_code == 2);
  CHECK_THAT(g.out, Contains("--format hf-gpt2") && Contains("Llama-family"));
  auto s = test::run_mtnlg("checkpoint export --max-shard-size 5XB --input " + ck + " --output " + d.str() + "/s");
  CHECK(s.exit_code == 2);
  CHECK_THAT(s.out, Contains("--max-shard-size: \"5XB\" is not a size"));
}
