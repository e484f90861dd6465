// GPT sample indices: numpy RandomState emulation, Megatron's split, epochs, sample
// boundaries, caching; [oracle] equality with numpy (test/data/megatron_index.py).
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.hpp"
#include "data/gpt_dataset.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::data;
using mtnlg::test::TempDir;

namespace {

// Documents of the given lengths whose token t of document d is (d*1000 + t) % 50000.
std::shared_ptr<IndexedDataset> make_dataset(const std::string& prefix, const std::vector<int32_t>& lens) {
  IndexedDatasetWriter w(prefix, DType::u16);
  for (size_t d = 0; d < lens.size(); ++d) {
    std::vector<int32_t> ids(static_cast<size_t>(lens[d]));
    for (int32_t t = 0; t < lens[d]; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>((d * 1000 + t) % 50000);
    w.add_document(ids);
  }
  w.finalize();
  return std::make_shared<IndexedDataset>(prefix);
}

std::string py_index() { return test::python() + " " + test::source_dir() + "/test/data/megatron_index.py"; }

}  // namespace

TEST_CASE("numpy RandomState: random_interval masks and rejects", "[data]") {
  // Draws above the mask's range are rejected, so values stay in [0, max].
  NumpyRandomState rng(7);
  for (uint64_t max : {1ull, 2ull, 5ull, 1000ull, 65536ull, 4294967295ull, 5000000000ull})
    for (int i = 0; i < 200; ++i) CHECK(rng.random_interval(max) <= max);
  CHECK(rng.random_interval(0) == 0);
  // A shuffle is a permutation.
  std::vector<int32_t> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = i;
  NumpyRandomState r2(1234);
  r2.shuffle(std::span<int32_t>(v));
  auto s = v;
  std::sort(s.begin(), s.end());
  for (int i = 0; i < 1000; ++i) REQUIRE(s[i] == i);
}

TEST_CASE("split parsing and Megatron's bookends", "[data]") {
  CHECK(parse_split("969,30,1")[0] == Approx(0.969));
  CHECK(parse_split("1")[1] == 0.0);
  CHECK(split_bounds("969,30,1", 1000) == std::vector<int64_t>{0, 969, 999, 1000});
  CHECK(split_bounds("98,2,0", 10) == std::vector<int64_t>{0, 10, 10, 10});
  // Megatron-Core: round(bookend * n). Legacy Megatron's rounded part sizes would give
  // {0, 3, 5, 10} here (round(2.5) = 2, round(2.5) = 2, round(5) = 5, shifted by -1).
  CHECK(split_bounds("1,1,2", 10) == std::vector<int64_t>{0, 2, 5, 10});
  // 115 documents under "969,30,1": legacy gives train [0, 112), Megatron-Core [0, 111).
  CHECK(split_bounds("969,30,1", 115) == std::vector<int64_t>{0, 111, 115, 115});
  CHECK(split_bounds("969,30,1", 49) == std::vector<int64_t>{0, 47, 49, 49});
  CHECK_THROWS_AS(parse_split("a,b"), InputError);
  CHECK_THROWS_AS(parse_split("0,0,0"), InputError);
  CHECK_THROWS_AS(parse_split("1,1,1,1"), InputError);
}

TEST_CASE("gpt indices: samples are seq_length+1 tokens with stride seq_length", "[data]") {
  TempDir tmp("gpt");
  auto ds = make_dataset((tmp / "d").string(), {5, 0, 17, 3, 9, 1, 30, 12});
  GptDatasetConfig cfg;
  cfg.seq_length = 8;
  cfg.num_samples = 30;  // several epochs
  cfg.split = "1";
  GptDataset g(ds, cfg);
  const auto& ix = g.indices();
  CHECK(ix.tokens_per_epoch == 77);
  // E = smallest e with e*77 >= 30*8+1 = 241 -> 4
  CHECK(ix.num_epochs == 4);
  CHECK(g.size() == (4 * 77 - 1) / 8);
  CHECK(g.size() >= cfg.num_samples);
  // Unshuffled, consecutive samples overlap by one token: rebuild the token stream from
  // doc_idx and compare each sample with its window.
  std::vector<int32_t> stream;
  for (int32_t d : ix.doc_idx) {
    auto v = ds->get(d);
    stream.insert(stream.end(), v.begin(), v.end());
  }
  std::vector<int32_t> buf(9);
  for (int64_t i = 0; i < g.size(); ++i) {
    g.sample(i, buf.data());
    const int64_t j = ix.shuffle_idx[static_cast<size_t>(i)];
    for (int k = 0; k < 9; ++k) REQUIRE(buf[k] == stream[static_cast<size_t>(j * 8 + k)]);
  }
}

TEST_CASE("gpt indices: empty parts are InputErrors, tiny parts wrap like Megatron", "[data]") {
  TempDir tmp("gpt");
  auto ds = make_dataset((tmp / "d").string(), {4, 4, 4});
  GptDatasetConfig cfg;
  cfg.seq_length = 4;
  cfg.num_samples = 2;
  cfg.split = "100,0,0";
  cfg.split_index = 1;
  try {
    GptDataset g(ds, cfg);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("empty"));
    CHECK_THAT(e.what(), Catch::Matchers::Contains("valid"));
  }
  // A part shorter than one sample: built as Megatron does, samples wrap over epochs.
  cfg.split = "1";
  cfg.split_index = 0;
  cfg.seq_length = 12;  // 12 tokens < 13 needed
  cfg.num_samples = 5;
  {
    GptDataset g(ds, cfg);
    CHECK(g.indices().num_epochs == 6);  // smallest E with 12 E >= 5 * 12 + 1
    CHECK(g.size() >= 5);
    std::vector<int32_t> buf(13);
    for (int64_t i = 0; i < g.size(); ++i) {
      g.sample(i, buf.data());
      CHECK(g.documents(i).size() >= 4);  // 13 tokens span at least four 4-token documents
    }
  }
  // No tokens at all (sequences of length 0): an error that says how many one sample needs.
  try {
    const std::vector<int32_t> zeros{0, 0, 0};
    build_gpt_indices(zeros, 0, 3, 12, 5, 1234, "part");
    FAIL("expected InputError");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("0 tokens"));
    CHECK_THAT(e.what(), Catch::Matchers::Contains("13 tokens"));
  }
}

TEST_CASE("gpt indices: cached on disk, reused, rebuilt when inputs change", "[data]") {
  TempDir tmp("gpt");
  const std::string prefix = (tmp / "d").string();
  auto ds = make_dataset(prefix, {50, 60, 70, 80});
  GptDatasetConfig cfg;
  cfg.seq_length = 16;
  cfg.num_samples = 20;
  cfg.split = "1";
  cfg.cache_dir = (tmp / "cache").string();
  GptDataset a(ds, cfg);
  CHECK_FALSE(a.loaded_from_cache());
  CHECK(std::filesystem::exists(a.cache_file()));
  GptDataset b(ds, cfg);
  CHECK(b.loaded_from_cache());
  CHECK(b.indices().shuffle_idx == a.indices().shuffle_idx);
  CHECK(b.indices().doc_idx == a.indices().doc_idx);
  cfg.seed = 99;
  GptDataset c(ds, cfg);
  CHECK_FALSE(c.loaded_from_cache());
  // A damaged cache file is rebuilt, not trusted.
  test::write_file(a.cache_file(), "garbage");
  cfg.seed = 1234;
  GptDataset d(ds, cfg);
  CHECK_FALSE(d.loaded_from_cache());
  CHECK(d.indices().shuffle_idx == a.indices().shuffle_idx);
  // New files under the same prefix (different size) -> different key.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto ds2 = make_dataset(prefix, {50, 60, 70, 81});
  GptDataset e(ds2, cfg);
  CHECK_FALSE(e.loaded_from_cache());
  int64_t tmpfiles = 0;
  for (auto& f : std::filesystem::directory_iterator(cfg.cache_dir))
    tmpfiles += f.path().string().find(".tmp") != std::string::npos;
  CHECK(tmpfiles == 0);
}

TEST_CASE("numpy RandomState shuffle equals numpy's", "[data][oracle]") {
  if (!test::python_has("numpy")) {
    WARN("skipped: no numpy");
    return;
  }
  for (auto [n, seed] :
       {std::pair<int64_t, uint32_t>{1, 1}, {2, 1234}, {10, 0}, {257, 42}, {1000, 1234}, {65537, 4294967295u}}) {
    auto r = test::run_command(py_index() + " shuffle " + std::to_string(n) + " " + std::to_string(seed));
    REQUIRE(r.exit_code == 0);
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
    NumpyRandomState rng(seed);
    rng.shuffle(std::span<int64_t>(v));
    INFO("n=" << n << " seed=" << seed);
    CHECK(v == nlohmann::json::parse(r.out).get<std::vector<int64_t>>());
  }
  for (int64_t n : {1, 7, 10, 49, 115, 116, 999, 1000, 1001, 4321}) {
    for (std::string sp : {"969,30,1", "1,1,2", "98,2", "1", "3,3,3"}) {
      auto r = test::run_command(py_index() + " split " + sp + " " + std::to_string(n));
      REQUIRE(r.exit_code == 0);
      INFO("split " << sp << " n=" << n);
      CHECK(split_bounds(sp, n) == nlohmann::json::parse(r.out).get<std::vector<int64_t>>());
    }
  }
}

TEST_CASE("gpt indices equal the numpy reference build", "[data][oracle]") {
  if (!test::python_has("numpy")) {
    WARN("skipped: no numpy");
    return;
  }
  TempDir tmp("gpt-oracle");
  // Varied lengths including empty documents; cases: one epoch, several epochs with a
  // separate short final epoch, several epochs without, a split's middle part.
  std::vector<int32_t> sizes;
  uint32_t x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 1103515245u + 12345u;
    sizes.push_back(static_cast<int32_t>((x >> 16) % 97) * (i % 13 == 0 ? 0 : 1));
  }
  struct Case {
    int64_t begin, end, seq, n;
    uint32_t seed;
  };
  for (Case c : {Case{0, 300, 32, 100, 1234}, Case{0, 300, 32, 1700, 1234}, Case{0, 300, 64, 560, 7},
                 Case{0, 300, 16, 2950, 3}, Case{290, 300, 8, 500, 99}, Case{100, 200, 128, 77, 1},
                 // parts shorter than one sample (Megatron wraps them over many epochs)
                 Case{1, 3, 256, 5, 11}, Case{40, 41, 128, 9, 5}}) {
    nlohmann::json args = {{"sizes", sizes},      {"begin", c.begin},   {"end", c.end},
                           {"seq_length", c.seq}, {"num_samples", c.n}, {"seed", c.seed}};
    test::write_file(tmp / "args.json", args.dump());
    auto r = test::run_command(py_index() + " build " + (tmp / "args.json").string());
    REQUIRE(r.exit_code == 0);
    auto want = nlohmann::json::parse(r.out);
    auto got = build_gpt_indices(sizes, c.begin, c.end, c.seq, c.n, c.seed, "test");
    INFO("case begin=" << c.begin << " end=" << c.end << " seq=" << c.seq << " n=" << c.n);
    CHECK(got.num_epochs == want["epochs"].get<int64_t>());
    CHECK(got.separate_final_epoch == want["separate"].get<bool>());
    CHECK(got.doc_idx == want["doc_idx"].get<std::vector<int32_t>>());
    CHECK(got.sample_idx == want["sample_idx"].get<std::vector<int64_t>>());
    CHECK(got.shuffle_idx == want["shuffle_idx"].get<std::vector<int64_t>>());
  }
}
