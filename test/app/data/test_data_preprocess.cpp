// `mtnlg data preprocess|inspect` through the binary: formats, worker invariance, json
// keys, bad input (exit 2 naming file:line / key / file and mismatch), nothing half-written.
#include <zstd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.hpp"
#include "test/support/data_util.hpp"

using namespace mtnlg;
using namespace mtnlg::data;
using mtnlg::test::TempDir;
namespace fs = std::filesystem;

namespace {

using test::gpt2_vocab_args;
using test::write_gz;
std::string corpus(int64_t docs) { return test::jsonl_corpus(docs); }

void write_zst(const fs::path& p, const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3));
  test::write_file(p, out);
}

using test::count_files;

}  // namespace

TEST_CASE("e2e preprocess: plain/gz/zst and 1 or 3 workers give identical files", "[data][e2e]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("pre");
  const std::string text = corpus(1500);
  test::write_file(tmp / "c.jsonl", text);
  write_gz(tmp / "c.jsonl.gz", text);
  write_zst(tmp / "c.jsonl.zst", text);
  auto run = [&](const std::string& in, const std::string& out, const std::string& extra) {
    auto r = test::run_mtnlg("data preprocess --input " + (tmp / in).string() + " --output-prefix " +
                             (tmp / out).string() + gpt2_vocab_args() + " --append-eod --no-progress" + extra);
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    return r.out;
  };
  const std::string out = run("c.jsonl", "plain", " --workers 1");
  CHECK_THAT(out, Catch::Matchers::Contains("1500 documents"));
  run("c.jsonl.gz", "gz", " --workers 3");
  run("c.jsonl.zst", "zst", " --workers 2");
  for (std::string p : {"gz", "zst"})
    for (std::string ext : {".bin", ".idx"})
      CHECK(test::read_file(tmp / ("plain_text_document" + ext)) ==
            test::read_file(tmp / (p + "_text_document" + ext)));

  // Content: each document is encode(text) + EOD; empty documents repeat the boundary.
  IndexedDataset ds((tmp / "plain_text_document").string());
  CHECK(ds.num_documents() == 1500);
  const auto docidx = ds.document_indices();
  int64_t seq = 0, d = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string t = nlohmann::json::parse(line)["text"].get<std::string>();
    if (t.empty()) {
      REQUIRE(docidx[static_cast<size_t>(d + 1)] == docidx[static_cast<size_t>(d)]);
    } else {
      auto want = tok->encode(t);
      want.push_back(50256);
      REQUIRE(ds.get(seq) == want);
      ++seq;
    }
    ++d;
  }
  CHECK(seq == ds.num_sequences());
}

TEST_CASE("e2e preprocess: several json keys give one pair each", "[data][e2e]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("pre");
  test::write_file(tmp / "c.jsonl", corpus(40));
  auto r = test::run_mtnlg("data preprocess --input " + (tmp / "c.jsonl").string() + " --output-prefix " +
                           (tmp / "o").string() + gpt2_vocab_args() + " --json-keys text title --no-progress");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  IndexedDataset title((tmp / "o_title_document").string());
  CHECK(title.num_documents() == 40);
  CHECK(tok->decode(title.get(3)) == "doc 3");
  CHECK(IndexedDataset((tmp / "o_text_document").string()).num_documents() == 40);
  auto ins = test::run_mtnlg("data inspect " + (tmp / "o_title_document").string());
  CHECK(ins.exit_code == 0);
  CHECK_THAT(ins.out, Catch::Matchers::Contains("uint16"));
}

TEST_CASE("e2e preprocess: bad lines fail with file:line or are skipped and counted", "[data][e2e]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("pre");
  std::string text = corpus(700);
  text += "{\"text\": \"unterminated\n";  // line 701
  text += corpus(3);
  test::write_file(tmp / "bad.jsonl", text);
  const std::string base = "data preprocess --input " + (tmp / "bad.jsonl").string() + " --output-prefix " +
                           (tmp / "o").string() + gpt2_vocab_args() + " --no-progress";
  for (std::string workers : {"1", "3"}) {
    auto r = test::run_mtnlg(base + " --workers " + workers);
    INFO(r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Catch::Matchers::Contains("bad.jsonl:701: malformed JSON"));
    CHECK_THAT(r.out, Catch::Matchers::Contains("--skip-bad-lines"));
    CHECK(count_files(tmp.path()) == 1);  // nothing written, no temporaries left
  }
  auto ok = test::run_mtnlg(base + " --skip-bad-lines --workers 2");
  INFO(ok.out);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.out, Catch::Matchers::Contains("skipped 1 bad lines (first: " + (tmp / "bad.jsonl").string() + ":701"));
  CHECK_THAT(ok.out, Catch::Matchers::Contains("703 documents"));
}

TEST_CASE("e2e preprocess: a missing json key names the line and the key", "[data][e2e]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("pre");
  test::write_file(tmp / "k.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  auto r = test::run_mtnlg("data preprocess --input " + (tmp / "k.jsonl").string() + " --output-prefix " +
                           (tmp / "o").string() + gpt2_vocab_args() + " --no-progress");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("k.jsonl:2: missing key 'text' (keys present: body"));
  CHECK(count_files(tmp.path()) == 1);
  auto missing = test::run_mtnlg("data preprocess --input " + (tmp / "nope.jsonl").string() + " --output-prefix " +
                                 (tmp / "o").string() + gpt2_vocab_args());
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.out, Catch::Matchers::Contains("nope.jsonl: input file not found"));
}

TEST_CASE("e2e inspect: truncated or foreign .bin/.idx exit 2 naming the file", "[data][e2e]") {
  TempDir tmp("ins");
  const std::string p = (tmp / "d").string();
  {
    IndexedDatasetWriter w(p, DType::u16);
    std::vector<int32_t> a{1, 2, 3, 4};
    w.add_document(a);
    w.finalize();
  }
  auto good = test::run_mtnlg("data inspect " + p);
  CHECK(good.exit_code == 0);
  CHECK_THAT(good.out, Catch::Matchers::Contains("4"));
  const std::string bin = test::read_file(p + ".bin");
  test::write_file(p + ".bin", bin.substr(0, 5));
  auto r = test::run_mtnlg("data inspect " + p);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("d.bin: 5 bytes"));
  CHECK_THAT(r.out, Catch::Matchers::Contains("truncated"));
  test::write_file(p + ".idx", "PK\x03\x04 this is a zip file");
  r = test::run_mtnlg("data inspect " + p);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("d.idx: not a Megatron index"));
}

TEST_CASE("e2e inspect --recipe: blend table; missing prefix, empty split, short dataset exit 2", "[data][e2e]") {
  TempDir tmp("ins");
  const std::string a = (tmp / "a_text_document").string(), b = (tmp / "b_text_document").string();
  for (auto [p, n] : {std::pair<std::string, int>{a, 300}, {b, 100}}) {
    IndexedDatasetWriter w(p, DType::u16);
    std::vector<int32_t> ids(50, 7);
    for (int i = 0; i < n; ++i) w.add_document(ids);
    w.finalize();
  }
  auto recipe = [&](const std::string& blend, const std::string& split, int seq) {
    const std::string text =
        "model:\n  num_layers: 2\n  hidden_size: 32\n  num_attention_heads: 4\n  seq_length: " + std::to_string(seq) +
        "\n  vocab_size: 100\n  make_vocab_size_divisible_by: 8\n"
        "training:\n  micro_batch_size: 2\n  global_batch_size: 8\n  train_iters: 100\n"
        "data:\n  split: \"" +
        split + "\"\n  cache_dir: " + (tmp / "cache").string() + "\n  blend:\n" + blend;
    test::write_file(tmp / "r.yaml", text);
    return (tmp / "r.yaml").string();
  };
  const std::string both = "    - {weight: 3, prefix: " + a + "}\n    - {weight: 1, prefix: " + b + "}\n";
  auto r = test::run_mtnlg("data inspect --build-index --recipe " + recipe(both, "969,30,1", 32));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("75.00%"));
  CHECK_THAT(r.out, Catch::Matchers::Contains("15.00K"));  // 300 docs * 50 tokens
  CHECK_THAT(r.out, Catch::Matchers::Contains("600 samples"));
  CHECK_THAT(r.out, Catch::Matchers::Contains("200 samples"));

  r = test::run_mtnlg("data inspect --recipe " +
                      recipe(both + "    - {weight: 1, prefix: " + (tmp / "zz").string() + "}\n", "969,30,1", 32));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("data.blend[2].prefix"));

  r = test::run_mtnlg("data inspect --build-index --recipe " + recipe(both, "0,1,0", 32));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("leaves this part empty"));

  // b's train part is one 50-token document, shorter than one 65-token sample: Megatron
  // builds it anyway (samples wrap over epochs), and so does mtnlg.
  r = test::run_mtnlg("data inspect --build-index --recipe " + recipe(both, "1,99,0", 64));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("200 samples"));
}

namespace {

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::stringstream ss(out);
  for (std::string line; std::getline(ss, line);)
    if (!line.empty() && line[0] == '{') v.push_back(nlohmann::json::parse(line));
  return v;
}

}  // namespace

// Megatron-Core's split bounds and the single-source orders, computed by
// test/data/megatron_index.py from the rules (numpy, RandomState), against
// `mtnlg data samples --json`, on a document count where legacy and current split differ.
TEST_CASE("e2e data samples: Megatron-Core split, unweighted and weighted single source equal numpy",
          "[data][e2e][oracle]") {
  if (!test::python_has("numpy")) {
    WARN("skipped: no numpy");
    return;
  }
  TempDir tmp("samples");
  const std::string py = test::python() + " " + test::source_dir() + "/test/data/megatron_index.py";
  const std::string prefix = (tmp / "d_text_document").string();
  constexpr int kDocs = 115, kSeq = 16;
  std::vector<int32_t> sizes;
  {
    IndexedDatasetWriter w(prefix, DType::u16);
    for (int d = 0; d < kDocs; ++d) {
      sizes.push_back(20 + (d * 37) % 50);
      std::vector<int32_t> ids;
      for (int p = 0; p < sizes.back(); ++p) ids.push_back((131 * d + p) % 50000);  // megatron_index.py's token()
      w.add_document(ids);
    }
    w.finalize();
  }
  // The two split rules disagree on 115 documents: train [0, 112) legacy, [0, 111) now.
  auto core = test::run_command(py + " split 969,30,1 " + std::to_string(kDocs));
  auto legacy = test::run_command(py + " split_legacy 969,30,1 " + std::to_string(kDocs));
  REQUIRE(core.exit_code == 0);
  const auto bounds = nlohmann::json::parse(core.out).get<std::vector<int64_t>>();
  CHECK(bounds == std::vector<int64_t>{0, 111, 115, 115});
  CHECK(nlohmann::json::parse(legacy.out).get<std::vector<int64_t>>() == std::vector<int64_t>{0, 112, 115, 115});

  // Train samples = one epoch of the train part exactly: the unweighted build has one
  // epoch, the weighted one (1.005 surplus) two, so the shuffles differ.
  int64_t train_tokens = 0;
  for (int d = 0; d < bounds[1]; ++d) train_tokens += sizes[static_cast<size_t>(d)];
  const int64_t n = (train_tokens - 1) / kSeq;
  const int64_t eval_interval = 50, eval_iters = 3;
  const int64_t n_valid = (n / eval_interval + 1) * eval_iters;  // Megatron: (iters // interval + 1) * eval_iters * gbs
  auto recipe = [&](const std::string& data) {
    const std::string text =
        "model:\n  num_layers: 2\n  hidden_size: 32\n  num_attention_heads: 4\n  seq_length: " + std::to_string(kSeq) +
        "\n  vocab_size: 50257\ntraining:\n  micro_batch_size: 1\n  global_batch_size: 1\n"
        "  train_iters: " +
        std::to_string(n) + "\n  eval_interval: " + std::to_string(eval_interval) +
        "\n  eval_iters: " + std::to_string(eval_iters) +
        "\ndata:\n  split: \"969,30,1\"\n  cache_dir: " + (tmp / "cache").string() + "\n" + data;
    test::write_file(tmp / "r.yaml", text);
    return (tmp / "r.yaml").string();
  };
  std::map<std::pair<bool, int>, std::vector<nlohmann::json>> got;
  for (bool weighted : {false, true}) {
    const std::string data =
        weighted ? "  blend:\n    - {weight: 1.0, prefix: " + prefix + "}\n" : "  path: " + prefix + "\n";
    for (int part : {0, 1}) {
      const int64_t want_n = part == 0 ? n : n_valid;
      const int64_t to = std::min<int64_t>(want_n, 60);
      auto r = test::run_mtnlg("data samples " + recipe(data) + " --json --range 0:" + std::to_string(to) + " --part " +
                               (part == 0 ? "train" : "valid"));
      INFO("weighted=" << weighted << " part=" << part << "\n" << r.out);
      REQUIRE(r.exit_code == 0);
      nlohmann::json args = {{"sizes", sizes},       {"split", "969,30,1"},   {"part", part},
                             {"seq_length", kSeq},   {"num_samples", want_n}, {"seed", 1234},
                             {"weighted", weighted}, {"range", {0, to}}};
      test::write_file(tmp / "args.json", args.dump());
      auto o = test::run_command(py + " stream " + (tmp / "args.json").string());
      REQUIRE(o.exit_code == 0);
      const auto mine = json_lines(r.out), theirs = json_lines(o.out);
      REQUIRE(mine.size() == static_cast<size_t>(to));
      REQUIRE(theirs.size() == mine.size());
      for (size_t i = 0; i < mine.size(); ++i) {
        INFO("sample " << i);
        CHECK(mine[i] == theirs[i]);
      }
      got[{weighted, part}] = mine;
    }
  }
  // The surplus matters: the weighted single source reads other samples.
  int64_t same = 0;
  for (size_t i = 0; i < got[{false, 0}].size(); ++i) same += got[{false, 0}][i] == got[{true, 0}][i];
  CHECK(same < 10);

  // Text output, a range past the end, and a part the split leaves empty.
  auto r = test::run_mtnlg("data samples " + recipe("  path: " + prefix + "\n") + " --range 3:5");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("sample 4 | source 0 " + prefix + " | documents "));
  r = test::run_mtnlg("data samples " + recipe("  path: " + prefix + "\n") + " --range 0:100000");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("holds"));
  r = test::run_mtnlg("data samples " + recipe("  path: " + prefix + "\n") + " --range 0:1 --part test");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("leaves this part empty"));
}
