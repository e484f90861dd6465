// data.eod_mask_loss (Megatron's --eod-mask-loss): targets after an input
// <|endoftext|> do not count. The loss is the mean over the tokens that count in the
// global batch, and its gradient is normalised by that count, so data-parallel and
// tensor-parallel (and context-parallel) layouts keep the single-process losses, and the test device (the
// mask is uploaded to the device) gives the CPU's bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;

namespace {

// Short documents over 64 ordinary tokens, each ending in <|endoftext|> (50256): many
// sequences of 16 tokens hold one or two document ends.
std::string eod_recipe(const fs::path& dir) {
  const std::string prefix = (dir / "docs").string();
  data::IndexedDatasetWriter w(prefix, data::DType::u16);
  uint64_t s = 99;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (int d = 0; d < 800; ++d) {
    std::vector<int32_t> doc;
    const int len = 4 + static_cast<int>(next() % 12);
    for (int k = 0; k < len; ++k) doc.push_back(static_cast<int32_t>(next() % 64));
    doc.push_back(50256);
    w.add_document(doc);
  }
  w.finalize();
  const std::string path = (dir / "eod.yaml").string();
  test::write_file(
      path,
      "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 50257,\n"
      "        make_vocab_size_divisible_by: 8, hidden_dropout: 0.0, attention_dropout: 0.0}\n"
      "training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 6, num_threads: 1}\n"
      "optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_tokens: 256}\n"
      "data:\n  split: '100,0,0'\n  blend: [{weight: 1.0, prefix: " +
          prefix + "}]\nlogging: {tensorboard: false}\n");
  return path;
}

std::vector<double> losses(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("grad_norm")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("eod_mask_loss: masked targets do not count; layouts and the test device keep the losses", "[mpi]") {
  test::TempDir dir("eod");
  const std::string recipe = eod_recipe(dir.path());
  auto run = [&](const std::string& tag, const std::string& sets, int np) {
    test::TempDir d("eod-" + tag);
    auto r = test::run_train(recipe, d.str(), sets, np);
    INFO(tag << ": " << test::train_command(recipe, d.str(), sets, np) << "\n" << r.out);
    REQUIRE(r.exit_code == 0);
    return losses(d.path());
  };
  const auto plain = run("plain", "", 1);
  const auto ref = run("ref", "--set data.eod_mask_loss=true", 1);
  REQUIRE(plain.size() == 6);
  REQUIRE(ref.size() == 6);
  CHECK(std::isfinite(ref[0]));
  CHECK(ref[0] != plain[0]);  // the masked positions changed what is averaged
  const auto dev = run("test-device", "--set data.eod_mask_loss=true --set training.device=test", 1);
  REQUIRE(dev == ref);  // bit for bit: the mask reaches the device by an upload
  for (auto [tag, sets, np] :
       {std::tuple{"dp2", "", 2}, std::tuple{"tp2", "--set parallel.tensor_model_parallel_size=2", 2},
        std::tuple{"pp2-dp2", "--set parallel.pipeline_model_parallel_size=2", 4},
        // each cp rank counts the whole sequences' mask and takes its rows of it
        std::tuple{"cp2-dp2", "--set parallel.context_parallel_size=2", 4}}) {
    const auto got = run(tag, std::string("--set data.eod_mask_loss=true ") + sets, np);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO(tag << " iteration " << i + 1);
      CHECK(std::fabs(got[i] - ref[i]) <= 1e-5 * std::fabs(ref[i]));
    }
  }
}
