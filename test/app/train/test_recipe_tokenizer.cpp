// The recipe's tokenizer (data.tokenizer_type, data.tokenizer_model;
// app/process/recipe_tokenizer.hpp): training's data.eod_mask_loss takes the
// end-of-document id from a Hugging Face tokenizer's tokenizer_config.json, the trainer
// refuses a tokenizer with more ids than model.vocab_size before any step, and eval and
// generate tokenize with the recipe's tokenizer when no --tokenizer is given.
#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.hpp"
#include "test/support/test_support.hpp"
#include "test/support/tiny_tokenizer.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using test::tiny_byte_level;

// DIR/tok/tokenizer.json (+ tokenizer_config.json naming <|eos|> when `config`), short
// documents over 64 ordinary ids each ending in 259 (<|eos|>), and a recipe of a tiny GPT
// over them with `data_keys` in its data section.
std::string setup(const fs::path& dir, bool config, const std::string& data_keys, int64_t vocab = 300) {
  fs::create_directories(dir / "tok");
  test::write_file(dir / "tok" / "tokenizer.json", tiny_byte_level().dump());
  if (config) test::write_file(dir / "tok" / "tokenizer_config.json", R"({"eos_token": {"content": "<|eos|>"}})");
  const std::string prefix = (dir / "docs").string();
  if (!fs::exists(prefix + ".bin")) {
    data::IndexedDatasetWriter w(prefix, data::DType::u16);
    uint64_t s = 7;
    auto next = [&] {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      return s;
    };
    for (int d = 0; d < 200; ++d) {
      std::vector<int32_t> doc;
      const int len = 4 + static_cast<int>(next() % 10);
      for (int k = 0; k < len; ++k) doc.push_back(static_cast<int32_t>(next() % 64));
      doc.push_back(259);
      w.add_document(doc);
    }
    w.finalize();
  }
  const std::string path = (dir / "r.yaml").string();
  test::write_file(path,
                   "model: {num_layers: 1, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: " +
                       std::to_string(vocab) +
                       ",\n        make_vocab_size_divisible_by: 8, hidden_dropout: 0.0, attention_dropout: 0.0}\n"
                       "training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 3, num_threads: 1}\n"
                       "optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_tokens: 64}\n"
                       "data:\n  split: '100,0,0'\n  blend: [{weight: 1.0, prefix: " +
                       prefix + "}]\n" + data_keys + "logging: {tensorboard: false}\n");
  return path;
}

const std::string kHf = "  tokenizer_type: HuggingFaceTokenizer\n  tokenizer_model: TOK\n";

std::string with_tok(std::string keys, const fs::path& tok) {
  keys.replace(keys.find("TOK"), 3, tok.string());
  return keys;
}

}  // namespace

TEST_CASE("e2e recipe tokenizer: eod_mask_loss takes the Hugging Face tokenizer's eos", "[e2e]") {
  test::TempDir d("rtok-eod");
  // The GPT-2 path told that <|endoftext|> is 259 (a vocab file of that one entry) masks
  // exactly what the Hugging Face path masks with eos_token <|eos|> = 259: the same losses.
  test::write_file(d.path() / "vocab.json", R"({"<|endoftext|>": 259})");
  const std::string gpt2 = setup(d.path(), true, "  vocab_file: " + (d.path() / "vocab.json").string() + "\n");
  test::TempDir a("rtok-eod-gpt2"), b("rtok-eod-hf"), c("rtok-eod-plain");
  auto ra = test::run_train(gpt2, a.str(), "--set data.eod_mask_loss=true");
  INFO(ra.out);
  REQUIRE(ra.exit_code == 0);
  // tokenizer_model as a directory holding tokenizer.json
  const std::string hf = setup(d.path(), true, with_tok(kHf, d.path() / "tok"));
  auto rb = test::run_train(hf, b.str(), "--set data.eod_mask_loss=true");
  INFO(rb.out);
  REQUIRE(rb.exit_code == 0);
  auto rc = test::run_train(hf, c.str(), "");
  REQUIRE(rc.exit_code == 0);
  const auto la = test::read_losses(a.path()), lb = test::read_losses(b.path()), lc = test::read_losses(c.path());
  REQUIRE(la.size() == 3);
  CHECK(lb == la);
  CHECK(lc[0] != lb[0]);  // the mask changed what is averaged

  // No tokenizer_config.json beside it: exit 2 naming the keys.
  fs::remove(d.path() / "tok" / "tokenizer_config.json");
  const std::string bare = setup(d.path(), false, with_tok(kHf, d.path() / "tok" / "tokenizer.json"));
  auto re = test::run_train(bare, b.str(), "--set data.eod_mask_loss=true");
  CHECK(re.exit_code == 2);
  CHECK_THAT(re.out, Contains("data.eod_mask_loss: data.tokenizer_model") && Contains("has no end-of-document token"));
}

TEST_CASE("e2e recipe tokenizer: the trainer checks it against model.vocab_size", "[e2e]") {
  test::TempDir d("rtok-vocab");
  test::TempDir run("rtok-vocab-run");
  // 260 ids do not fit 200: refused before any step, naming both keys.
  auto small = test::run_train(setup(d.path(), true, with_tok(kHf, d.path() / "tok"), 200), run.str(), "");
  CHECK(small.exit_code == 2);
  CHECK_THAT(small.out,
             Contains("data.tokenizer_model") && Contains("has 260 tokens, more than model.vocab_size (200)"));
  CHECK_FALSE(fs::exists(run.path() / "metrics.jsonl"));
  // GPT-2's vocab file is counted too.
  test::write_file(d.path() / "big.json", R"({"a": 0, "b": 1, "c": 2})");
  auto g = test::run_train(setup(d.path(), true, "  vocab_file: " + (d.path() / "big.json").string() + "\n", 2),
                           run.str(), "");
  CHECK(g.exit_code == 2);
  CHECK_THAT(g.out, Contains("data.vocab_file") && Contains("has 3 tokens, more than model.vocab_size (2)"));
  // A tokenizer_model that is not there, or a directory without tokenizer.json.
  auto missing = test::run_train(setup(d.path(), true, with_tok(kHf, d.path() / "nope.json")), run.str(), "");
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.out, Contains("data.tokenizer_model " + (d.path() / "nope.json").string() + ": no such file"));
  auto empty_dir = test::run_train(setup(d.path(), true, with_tok(kHf, d.path())), run.str(), "");
  CHECK(empty_dir.exit_code == 2);
  CHECK_THAT(empty_dir.out, Contains("a directory without a tokenizer.json"));
}

TEST_CASE("e2e recipe tokenizer: eval and generate use the recipe's when no --tokenizer is given", "[e2e]") {
  test::TempDir d("rtok-gen");
  const std::string recipe = setup(d.path(), true, with_tok(kHf, d.path() / "tok" / "tokenizer.json"));
  const std::string tok = " --tokenizer " + (d.path() / "tok" / "tokenizer.json").string();
  const std::string gen = " --prompt 'the theme' --max-new-tokens 4 --greedy --device cpu";
  // --random-init: its recipe's tokenizer; the same text as with --tokenizer given.
  auto a = test::run_mtnlg("generate --random-init " + recipe + gen);
  auto b = test::run_mtnlg("generate --random-init " + recipe + gen + tok);
  INFO(a.out << "\n" << b.out);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  CHECK(a.out == b.out);
  // A trained checkpoint carries the recipe, and with it the tokenizer.
  test::TempDir run("rtok-gen-run");
  REQUIRE(test::run_train(
              recipe, run.str(),
              "--set training.train_iters=1 --set checkpoint.save=" + d.str() + "/ck --set checkpoint.save_interval=1")
              .exit_code == 0);
  auto c = test::run_mtnlg("generate --checkpoint " + d.str() + "/ck" + gen);
  auto e = test::run_mtnlg("generate --checkpoint " + d.str() + "/ck" + gen + tok);
  INFO(c.out << "\n" << e.out);
  REQUIRE(c.exit_code == 0);
  CHECK(c.out == e.out);
  // eval too: the fixture's lambada scored with the recipe's tokenizer, as with --tokenizer.
  const std::string ev = " --tasks lambada_openai --limit 3 --no-progress --device cpu --data-dir " +
                         test::source_dir() + "/test/fixtures/eval";
  auto f = test::run_mtnlg("eval --checkpoint " + d.str() + "/ck" + ev);
  auto g = test::run_mtnlg("eval --checkpoint " + d.str() + "/ck" + ev + tok);
  INFO(f.out << "\n" << g.out);
  REQUIRE(f.exit_code == 0);
  REQUIRE(g.exit_code == 0);
  CHECK(f.out.substr(0, f.out.find("requests in")) == g.out.substr(0, g.out.find("requests in")));
  // The recipe's file gone (a checkpoint trained elsewhere): exit 2 saying so.
  fs::rename(d.path() / "tok", d.path() / "tok-moved");
  auto gone = test::run_mtnlg("generate --checkpoint " + d.str() + "/ck" + gen);
  CHECK(gone.exit_code == 2);
  CHECK_THAT(gone.out, Contains("data.tokenizer_model") && Contains("pass --tokenizer to name the file here"));
  fs::rename(d.path() / "tok-moved", d.path() / "tok");
  if (!fs::exists(test::source_dir() + "/third_party/gpt2/vocab.json"))
    FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  // Without it, GPT-2's ids (up to 50256) would not fit this 300-id model: the recipe's
  // tokenizer is what made these runs work.
  auto gpt2 = test::run_mtnlg("generate --checkpoint " + d.str() + "/ck" + gen + " --vocab-file " + test::source_dir() +
                              "/third_party/gpt2/vocab.json --merge-file " + test::source_dir() +
                              "/third_party/gpt2/merges.txt");
  CHECK(gpt2.exit_code == 2);
  CHECK_THAT(gpt2.out, Contains("outside the vocabulary [0, 300)"));
}
