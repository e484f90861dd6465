// Hugging Face GPT-2 interchange: `checkpoint export --format hf-gpt2` gives logits in
// PyTorch (loaded the way transformers' GPT2LMHeadModel does) equal to mtnlg's, and
// `import` of that export restores the same weights.
#include <catch2/catch.hpp>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/process/module_configs.hpp"
#include "core/safetensors.hpp"
#include "model/checkpoint.hpp"
#include "model/inference.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;

TEST_CASE("checkpoint: Hugging Face export matches PyTorch and import round-trips", "[oracle]") {
  if (!test::python_has("torch")) FAIL("Debian's python3-torch is missing (scripts/install-deps.sh installs it)");
  test::TempDir d("hf");
  Recipe r = parse_recipe(
      "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 12, vocab_size: 300, "
      "make_vocab_size_divisible_by: 128}\ntraining: {micro_batch_size: 1, global_batch_size: 1, train_iters: 1}\n"
      "data: {mock: true}\n",
      "hf.yaml");
  model::GptConfig cfg = app::gpt_config(r);
  model::LoadedModel m = model::make_random_model(cfg, 7);
  // non-trivial norms and biases
  for (auto& p : m.store.infos())
    if (p.init == model::InitKind::zeros || p.init == model::InitKind::ones)
      for (int64_t i = 0; i < p.numel; ++i)
        m.store.params().data<float>()[p.offset + i] += 0.01f * static_cast<float>(i % 7) - 0.03f;
  app::save_whole_model(d.str() + "/ckpt", r, m.store, 0);
  auto ex =
      test::run_mtnlg("checkpoint export --format hf-gpt2 --input " + d.str() + "/ckpt --output " + d.str() + "/hf");
  INFO(ex.out);
  REQUIRE(ex.exit_code == 0);

  const int64_t B = 2, T = 9, V = 300;
  std::vector<int32_t> toks(B * T);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 37 + 5) % V);
  auto chunk = model::whole_model_chunk(m.cfg, m.store);
  std::vector<int64_t> all_rows(B * T);
  for (int64_t i = 0; i < B * T; ++i) all_rows[i] = i;
  Tensor logits = model::logits_at(*chunk, toks.data(), B, T, all_rows);  // [B*T, padded]
  Tensor real = Tensor::empty({B, T, V});
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t v = 0; v < V; ++v) real.data<float>()[i * V + v] = logits.data<float>()[i * logits.dim(1) + v];
  Tensor tt = Tensor::empty({B, T}, DType::i32);
  std::copy(toks.begin(), toks.end(), tt.data<int32_t>());
  safetensors::write(d.str() + "/ref.safetensors", {{"tokens", tt}, {"logits", real}});
  auto py = test::run_command(test::python() + " " + test::source_dir() + "/test/app/checkpoint/torch_hf_gpt2.py " +
                              d.str() + "/hf " + d.str() + "/ref.safetensors");
  INFO(py.out);
  CHECK(py.exit_code == 0);
  CHECK(py.out.find("PASS") != std::string::npos);

  auto im2 =
      test::run_mtnlg("checkpoint import --format hf-gpt2 --input " + d.str() + "/hf --output " + d.str() + "/back");
  INFO(im2.out);
  REQUIRE(im2.exit_code == 0);
  model::LoadedModel back = app::load_for_inference(d.str() + "/back");
  REQUIRE(back.store.numel() == m.store.numel());
  for (auto& p : m.store.infos()) {
    Tensor a = m.store.param(p.name), b = back.store.param(p.name);
    int64_t n = p.vocab_rows ? V * cfg.hidden : p.numel;  // padding rows are not exported
    for (int64_t i = 0; i < n; ++i) REQUIRE(a.data<float>()[i] == b.data<float>()[i]);
  }
  // bad input: a directory without config.json
  auto bad = test::run_mtnlg("checkpoint import --input " + d.str() + " --output " + d.str() + "/x");
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("config.json") != std::string::npos);
}
