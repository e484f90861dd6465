// `mtnlg data preprocess --tokenizer tokenizer.json` through the binary: Llama 3's file on
// the 6 MB tokenizer corpus gives int32 files whose documents are the tokenizer's ids and
// its EOS (tokenizer_config.json's eos_token), the same bytes for 1 and 3 workers and for
// 1 and 3 ranks; GPT-2's tokenizer.json gives the bytes of the vocab.json + merges.txt
// path; bad input (unsupported component, no EOS, both tokenizers, invalid UTF-8 in a
// line) exits 2 with one line naming it.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/hf_tokenizer.hpp"
#include "data/indexed_dataset.hpp"
#include "test/support/data_util.hpp"

using namespace mtnlg;
using namespace mtnlg::data;
using mtnlg::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string preprocess(const std::string& input, const std::string& prefix, const std::string& extra) {
  return " data preprocess --input " + input + " --output-prefix " + prefix + " --no-progress" + extra;
}

// The first `bytes` of the corpus's JSONL, whole lines.
std::string corpus_head(int64_t bytes) {
  const std::string all = test::read_file(test::tokenizer_corpus() + ".jsonl");
  const size_t cut =
      all.find('\n', static_cast<size_t>(std::min<int64_t>(bytes, static_cast<int64_t>(all.size()) - 1)));
  return all.substr(0, cut == std::string::npos ? all.size() : cut + 1);
}

}  // namespace

TEST_CASE("e2e preprocess --tokenizer: Llama 3 ids + EOS in int32 files, 1 and 3 workers identical", "[data][e2e]") {
  MTNLG_REQUIRE_HF(path, "llama3");
  TempDir tmp("pre-hf");
  const std::string input = test::tokenizer_corpus() + ".jsonl";
  for (std::string w : {"1", "3"}) {
    auto r = test::run_mtnlg(
        preprocess(input, (tmp / ("w" + w)).string(), " --tokenizer " + path + " --append-eod --workers " + w));
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
  }
  for (std::string ext : {".bin", ".idx"})
    CHECK(test::read_file(tmp / ("w1_text_document" + ext)) == test::read_file(tmp / ("w3_text_document" + ext)));
  IndexedDataset ds((tmp / "w1_text_document").string());
  CHECK(ds.dtype() == DType::i32);  // 128,256 ids do not fit in uint16 (Megatron's rule)
  auto tok = HfTokenizer::from_file(path);
  const int32_t eos = *tok->token_to_id("<|end_of_text|>");
  std::istringstream lines(test::read_file(input));
  std::string line;
  int64_t seq = 0, docs = 0;
  while (std::getline(lines, line)) {
    ++docs;
    auto want = tok->encode(nlohmann::json::parse(line)["text"].get<std::string>());
    if (want.empty()) continue;
    want.push_back(eos);
    REQUIRE(ds.get(seq) == want);
    ++seq;
  }
  CHECK(ds.num_documents() == docs);
  CHECK(seq == ds.num_sequences());
}

TEST_CASE("e2e preprocess --tokenizer: 1 and 3 ranks give the same bytes", "[data][mpi]") {
  MTNLG_REQUIRE_HF(path, "qwen3");
  TempDir tmp("pre-hf-ranks");
  test::write_file(tmp / "c.jsonl", corpus_head(1500000));
  const std::string args = " --tokenizer " + path + " --append-eod";
  auto r1 = test::run_command(std::string(MTNLG_BINARY) +
                              preprocess((tmp / "c.jsonl").string(), (tmp / "np1").string(), args));
  INFO(r1.out);
  REQUIRE(r1.exit_code == 0);
  auto r3 = test::run_command(test::mpirun(3) + MTNLG_BINARY +
                              preprocess((tmp / "c.jsonl").string(), (tmp / "np3").string(), args));
  INFO(r3.out);
  REQUIRE(r3.exit_code == 0);
  CHECK_THAT(r3.out, Catch::Matchers::Contains("(3 ranks)"));
  for (std::string ext : {".bin", ".idx"})
    CHECK(test::read_file(tmp / ("np1_text_document" + ext)) == test::read_file(tmp / ("np3_text_document" + ext)));
  CHECK(IndexedDataset((tmp / "np1_text_document").string()).dtype() == DType::i32);
}

TEST_CASE("e2e preprocess --tokenizer: GPT-2's tokenizer.json gives the bytes of vocab.json + merges.txt",
          "[data][e2e]") {
  MTNLG_REQUIRE_HF(path, "gpt2");
  TempDir tmp("pre-hf-gpt2");
  test::write_file(tmp / "c.jsonl", test::jsonl_corpus(800));
  auto a = test::run_mtnlg(
      preprocess((tmp / "c.jsonl").string(), (tmp / "files").string(), test::gpt2_vocab_args() + " --append-eod"));
  INFO(a.out);
  REQUIRE(a.exit_code == 0);
  auto b = test::run_mtnlg(preprocess((tmp / "c.jsonl").string(), (tmp / "json").string(),
                                      " --tokenizer " + path + " --eod-token '<|endoftext|>' --append-eod"));
  INFO(b.out);
  REQUIRE(b.exit_code == 0);
  for (std::string ext : {".bin", ".idx"})
    CHECK(test::read_file(tmp / ("files_text_document" + ext)) == test::read_file(tmp / ("json_text_document" + ext)));
  CHECK(IndexedDataset((tmp / "json_text_document").string()).dtype() == DType::u16);
}

TEST_CASE("e2e preprocess --tokenizer: bad input exits 2 with one line naming it", "[data][e2e]") {
  MTNLG_REQUIRE_HF(path, "llama3");
  TempDir tmp("pre-hf-bad");
  test::write_file(tmp / "c.jsonl", "{\"text\": \"hello\"}\n");
  const std::string in = (tmp / "c.jsonl").string();
  auto expect2 = [&](const std::string& args, const std::string& want) {
    auto r = test::run_mtnlg(preprocess(in, (tmp / "out").string(), args));
    INFO(args << "\n" << r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Catch::Matchers::Contains(want));
    CHECK(test::count_files(tmp.path()) == 1 + static_cast<int64_t>(fs::exists(tmp / "t.json")));  // nothing written
  };
  // An unsupported component, named with its JSON path.
  nlohmann::json j = nlohmann::json::parse(test::read_file(path));
  j["normalizer"] = nlohmann::json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Lowercase"}]})");
  test::write_file(tmp / "t.json", j.dump());
  expect2(" --tokenizer " + (tmp / "t.json").string(),
          "t.json: normalizer.normalizers[0].type: unsupported normalizer 'Lowercase'");
  // No tokenizer_config.json beside this copy: --append-eod needs --eod-token.
  j["normalizer"] = nullptr;
  test::write_file(tmp / "t.json", j.dump());
  expect2(" --tokenizer " + (tmp / "t.json").string() + " --append-eod",
          "t.json: no end-of-document token: pass --eod-token");
  expect2(" --tokenizer " + (tmp / "t.json").string() + " --append-eod --eod-token '<|nope|>'",
          "end-of-document token '<|nope|>' (--eod-token) is not a token");
  expect2(" --tokenizer " + path + test::gpt2_vocab_args(), "give either --tokenizer or --vocab-file/--merge-file");
  expect2(" --tokenizer " + path + " --allow-special-tokens", "--allow-special-tokens: only for GPT-2's files");
  expect2("", "no tokenizer: give --tokenizer");
  // Invalid UTF-8 in a JSONL line is malformed JSON (JSON text is Unicode): the line is
  // named; with --skip-bad-lines it is counted and skipped.
  test::write_file(tmp / "c.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xFF byte\"}\n");
  expect2(" --tokenizer " + path, "c.jsonl:2: malformed JSON");
  auto r = test::run_mtnlg(preprocess(in, (tmp / "skip").string(), " --tokenizer " + path + " --skip-bad-lines"));
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("skipped 1 bad lines (first: " + in + ":2: malformed JSON"));
}
