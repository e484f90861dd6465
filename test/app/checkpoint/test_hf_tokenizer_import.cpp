// `checkpoint import` of a Hugging Face directory with a tokenizer.json: the file (and its
// tokenizer_config.json) is checked and copied into the checkpoint root, and `generate
// --checkpoint` then tokenizes with it, as with `--tokenizer` given; a file that cannot
// run or does not fit the model stops the import (exit 2) before anything is written.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/process/module_configs.hpp"
#include "model/inference.hpp"
#include "test/support/test_support.hpp"
#include "test/support/tiny_tokenizer.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;

namespace {

using test::tiny_byte_level;

}  // namespace

TEST_CASE("e2e checkpoint import: tokenizer.json comes along and generate uses it", "[e2e]") {
  test::TempDir d("hf-tok");
  Recipe r = parse_recipe(
      "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 300, "
      "make_vocab_size_divisible_by: 128}\ntraining: {micro_batch_size: 1, global_batch_size: 1, train_iters: 1}\n"
      "data: {mock: true}\n",
      "hf.yaml");
  model::LoadedModel m = model::make_random_model(app::gpt_config(r), 11);
  app::save_whole_model(d.str() + "/ckpt", r, m.store, 0);
  auto ex =
      test::run_mtnlg("checkpoint export --format hf-gpt2 --input " + d.str() + "/ckpt --output " + d.str() + "/hf");
  INFO(ex.out);
  REQUIRE(ex.exit_code == 0);
  const std::string hf = d.str() + "/hf";

  // Refused before anything is written: an unsupported component, then more ids than the model has.
  nlohmann::json bad = tiny_byte_level();
  bad["normalizer"] = {{"type", "Lowercase"}};
  test::write_file(hf + "/tokenizer.json", bad.dump());
  auto r1 = test::run_mtnlg("checkpoint import --input " + hf + " --output " + d.str() + "/x");
  CHECK(r1.exit_code == 2);
  CHECK_THAT(r1.out, Catch::Matchers::Contains("tokenizer.json: normalizer.type: unsupported normalizer 'Lowercase'"));
  bad = tiny_byte_level();
  bad["model"]["vocab"]["zz"] = 350;
  test::write_file(hf + "/tokenizer.json", bad.dump());
  auto r2 = test::run_mtnlg("checkpoint import --input " + hf + " --output " + d.str() + "/x");
  CHECK(r2.exit_code == 2);
  CHECK_THAT(r2.out, Catch::Matchers::Contains("351 token ids, more than the model's vocab_size 300"));
  CHECK_FALSE(fs::exists(d.path() / "x"));

  test::write_file(hf + "/tokenizer.json", tiny_byte_level().dump());
  test::write_file(hf + "/tokenizer_config.json", R"({"eos_token": {"content": "<|eos|>"}})");
  nlohmann::json cfg = nlohmann::json::parse(test::read_file(hf + "/config.json"));
  cfg["bos_token_id"] = cfg["eos_token_id"] = 259;  // <|eos|>
  test::write_file(hf + "/config.json", cfg.dump(2));
  auto im = test::run_mtnlg("checkpoint import --input " + hf + " --output " + d.str() + "/back");
  INFO(im.out);
  REQUIRE(im.exit_code == 0);
  CHECK_THAT(im.out, Catch::Matchers::Contains("copied tokenizer.json"));
  CHECK(test::read_file(d.path() / "back" / "tokenizer.json") == test::read_file(hf + "/tokenizer.json"));
  CHECK(fs::exists(d.path() / "back" / "tokenizer_config.json"));
  // and an export of the imported checkpoint takes them along, with config.json's token ids
  auto re = test::run_mtnlg("checkpoint export --input " + d.str() + "/back --output " + d.str() + "/re");
  INFO(re.out);
  REQUIRE(re.exit_code == 0);
  CHECK(test::read_file(d.path() / "re" / "tokenizer.json") == test::read_file(hf + "/tokenizer.json"));
  CHECK(fs::exists(d.path() / "re" / "tokenizer_config.json"));
  const nlohmann::json re_cfg = nlohmann::json::parse(test::read_file(d.path() / "re" / "config.json"));
  CHECK(re_cfg["bos_token_id"] == 259);
  CHECK(re_cfg["eos_token_id"] == 259);

  // generate: the checkpoint's tokenizer.json by default, the same as naming it.
  const std::string gen =
      "generate --checkpoint " + d.str() + "/back --prompt 'the the' --max-new-tokens 8 --greedy --device cpu";
  auto g1 = test::run_mtnlg(gen);
  auto g2 = test::run_mtnlg(gen + " --tokenizer " + hf + "/tokenizer.json");
  INFO(g1.out << "\n" << g2.out);
  REQUIRE(g1.exit_code == 0);
  REQUIRE(g2.exit_code == 0);
  CHECK(g1.out == g2.out);
  CHECK_THAT(g1.out, Catch::Matchers::Contains("the the"));
  // eval: the checkpoint's tokenizer.json too (an empty context is its EOS), the same
  // results as naming it.
  const std::string ev = "eval --checkpoint " + d.str() +
                         "/back --tasks boolq --limit 3 --no-progress --device cpu --data-dir " + test::source_dir() +
                         "/test/fixtures/eval";
  auto e1 = test::run_mtnlg(ev + " --output " + d.str() + "/e1.json");
  auto e2 = test::run_mtnlg(ev + " --tokenizer " + hf + "/tokenizer.json --output " + d.str() + "/e2.json");
  INFO(e1.out << "\n" << e2.out);
  REQUIRE(e1.exit_code == 0);
  REQUIRE(e2.exit_code == 0);
  CHECK(nlohmann::json::parse(test::read_file(d.path() / "e1.json"))["results"] ==
        nlohmann::json::parse(test::read_file(d.path() / "e2.json"))["results"]);
  auto g3 = test::run_mtnlg(gen + " --tokenizer " + hf + "/tokenizer.json --eod-token '<|nope|>'");
  CHECK(g3.exit_code == 2);
  CHECK_THAT(g3.out, Catch::Matchers::Contains("end-of-document token '<|nope|>' (--eod-token) is not a token"));
}
