// Blends (Megatron's interleave and per-source sizes), the recipe blend source, the mock
// source and the per-rank loader.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "config/model.hpp"
#include "config/training.hpp"
#include "core/error.hpp"
#include "data/blended_dataset.hpp"
#include "data/sample_source.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::data;
using mtnlg::test::TempDir;

namespace {

void make_dataset(const std::string& prefix, int64_t docs, int64_t len, int32_t base) {
  IndexedDatasetWriter w(prefix, DType::u16);
  for (int64_t d = 0; d < docs; ++d) {
    std::vector<int32_t> ids(static_cast<size_t>(len));
    for (int64_t t = 0; t < len; ++t) ids[static_cast<size_t>(t)] = base + static_cast<int32_t>((d * 7 + t) % 1000);
    w.add_document(ids);
  }
  w.finalize();
}

// A blend at the recipe defaults' vocabulary and seed.
BlendSpec blend_spec(const std::vector<mtnlg::BlendSource>& blend, int64_t seq) {
  BlendSpec r;
  r.blend = blend;
  r.split = "90,5,5";
  r.seq_length = seq;
  r.vocab_size = ModelConfig{}.vocab_size;
  r.seed = TrainingConfig{}.seed;
  return r;
}

}  // namespace

TEST_CASE("blend: greedy interleave keeps every prefix close to the weights", "[data]") {
  const std::vector<double> w = normalize_weights(std::vector<double>{5, 3, 2});
  auto b = build_blend_index(w, 1000);
  CHECK(b.counts == std::vector<int64_t>{500, 300, 200});
  std::vector<int64_t> c(3, 0);
  for (int64_t i = 0; i < 1000; ++i) {
    const int d = b.dataset_index[static_cast<size_t>(i)];
    REQUIRE(b.dataset_sample_index[static_cast<size_t>(i)] == c[static_cast<size_t>(d)]);
    ++c[static_cast<size_t>(d)];
    for (int k = 0; k < 3; ++k) REQUIRE(std::abs(static_cast<double>(c[k]) - w[k] * (i + 1)) <= 1.0 + 1e-9);
  }
  // Ties go to the lowest index.
  auto t = build_blend_index(normalize_weights(std::vector<double>{1, 1}), 4);
  CHECK(t.dataset_index == std::vector<int16_t>{0, 1, 0, 1});
  CHECK(blend_source_samples(std::vector<double>{0.25, 0.75}, 1000) == std::vector<int64_t>{252, 754});
  CHECK_THROWS_AS(normalize_weights(std::vector<double>{1, 0}), InputError);
  CHECK_THROWS_AS(normalize_weights(std::vector<double>{}), InputError);
}

TEST_CASE("blend index equals the numpy reference", "[data][oracle]") {
  if (!test::python_has("numpy")) {
    WARN("skipped: no numpy");
    return;
  }
  for (std::string ws : {"0.3,0.7", "5,3,2", "1,1,1", "0.1,0.2,0.3,0.4,0.05"}) {
    auto r = test::run_command(test::python() + " " + test::source_dir() + "/test/data/megatron_index.py blend " + ws +
                               " 3001");
    REQUIRE(r.exit_code == 0);
    auto j = nlohmann::json::parse(r.out);
    std::vector<double> raw;
    for (size_t p = 0; p <= ws.size();) {
      size_t e = ws.find(',', p);
      if (e == std::string::npos) e = ws.size();
      raw.push_back(std::stod(ws.substr(p, e - p)));
      p = e + 1;
    }
    const auto w = normalize_weights(raw);
    auto b = build_blend_index(w, 3001);
    INFO("weights " << ws);
    std::vector<int64_t> idx(b.dataset_index.begin(), b.dataset_index.end());
    CHECK(idx == j["index"].get<std::vector<int64_t>>());
    CHECK(b.dataset_sample_index == j["sample"].get<std::vector<int64_t>>());
    CHECK(blend_source_samples(w, 3001) == j["per_source"].get<std::vector<int64_t>>());
  }
}

TEST_CASE("blend source from a recipe: sizes, sources, samples", "[data]") {
  TempDir tmp("blend");
  const std::string a = (tmp / "a_text_document").string(), b = (tmp / "b_text_document").string();
  make_dataset(a, 200, 40, 0);
  make_dataset(b, 100, 50, 20000);
  BlendSpec r = blend_spec({{0.7, a}, {0.3, b}}, 16);
  auto src = make_blend_source(r, 0, 300, (tmp / "cache").string());
  CHECK(src->size() == 300);
  CHECK(src->seq_length() == 16);
  CHECK(src->source_names() == std::vector<std::string>{a, b});
  std::vector<int32_t> buf(17);
  int64_t from_b = 0;
  for (int64_t i = 0; i < 300; ++i) {
    src->sample(i, buf.data());
    const bool is_b = buf[0] >= 20000;
    // Tokens come from the source the blend index names (the two id ranges are disjoint).
    REQUIRE(is_b == (src->source_of(i) == 1));
    from_b += is_b;
  }
  CHECK(from_b == 90);
  CHECK_THROWS_AS(src->sample(300, buf.data()), RuntimeError);
  // Same recipe, same order (from the cache this time).
  auto again = make_blend_source(r, 0, 300, (tmp / "cache").string());
  std::vector<int32_t> buf2(17);
  for (int64_t i = 0; i < 300; i += 37) {
    src->sample(i, buf.data());
    again->sample(i, buf2.data());
    REQUIRE(buf == buf2);
  }
}

TEST_CASE("blend source: missing prefix, empty split part, unweighted entry in a blend", "[data]") {
  TempDir tmp("blend");
  const std::string a = (tmp / "a").string();
  make_dataset(a, 20, 10, 0);
  auto expect = [](const BlendSpec& r, int part, const std::string& what) {
    try {
      make_blend_source(r, part, 10, "");
      FAIL("expected InputError");
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains(what));
    }
  };
  expect(blend_spec({{1, a}, {1, (tmp / "missing").string()}}, 8), 0, "data.blend[1].prefix");
  BlendSpec r = blend_spec({{1, a}}, 8);
  r.split = "100,0,0";
  expect(r, 1, "empty");
  // 18 train documents of 10 tokens = 180 tokens < 501: Megatron wraps, so does mtnlg.
  CHECK(make_blend_source(blend_spec({{1, a}}, 500), 0, 10, "")->size() == 10);
  BlendSpec two = blend_spec({{1, a}, {1, a}}, 8);
  two.blend[1].weighted = false;
  expect(two, 0, "has no weight");
  expect(blend_spec({}, 8), 0, "data.blend");
}

TEST_CASE("single source without weight: Megatron's unweighted order, no blend surplus", "[data]") {
  TempDir tmp("single");
  const std::string a = (tmp / "a").string();
  make_dataset(a, 100, 33, 0);
  BlendSpec weighted = blend_spec({{1.0, a}}, 16);
  BlendSpec unweighted = weighted;
  unweighted.blend[0].weighted = false;
  // Train part: 90 documents, 2970 tokens, 185 samples per epoch. 185 samples fit one
  // epoch; the weighted build asks for ceil(185 * 1.005) = 186, two epochs: another shuffle.
  auto u = make_blend_source(unweighted, 0, 185, "");
  auto w = make_blend_source(weighted, 0, 185, "");
  CHECK(u->size() == 185);
  CHECK(w->size() == 185);
  std::vector<int32_t> bu(17), bw(17);
  int64_t same = 0;
  for (int64_t i = 0; i < 185; ++i) {
    u->sample(i, bu.data());
    w->sample(i, bw.data());
    same += bu == bw;
    CHECK(u->source_of(i) == 0);
    CHECK(!u->documents_of(i).empty());
  }
  CHECK(same < 20);
  // The unweighted source is the GPT dataset itself: its own shuffle, element for element.
  auto ds = std::make_shared<const IndexedDataset>(a);
  GptDatasetConfig cfg;
  cfg.seq_length = 16;
  cfg.num_samples = 185;
  cfg.split = "90,5,5";
  GptDataset g(ds, cfg);
  for (int64_t i = 0; i < 185; i += 17) {
    u->sample(i, bu.data());
    g.sample(i, bw.data());
    CHECK(bu == bw);
    CHECK(u->documents_of(i) == g.documents(i));
  }
}

TEST_CASE("mock source is a pure function of (seed, index)", "[data]") {
  auto a = make_mock_source(50257, 32, 1234), b = make_mock_source(50257, 32, 1234), c = make_mock_source(50257, 32, 1);
  std::vector<int32_t> x(33), y(33), z(33);
  a->sample(12345, x.data());
  b->sample(12345, y.data());
  c->sample(12345, z.data());
  CHECK(x == y);
  CHECK(x != z);
  a->sample(12346, y.data());
  CHECK(x != y);
  for (int32_t v : x) CHECK((v >= 0 && v < 50257));
  a->sample(a->size() + 12345, y.data());  // wraps
  CHECK(x == y);
  // Roughly uniform: small vocab, many draws.
  auto s = make_mock_source(4, 999, 7);
  std::vector<int32_t> big(1000);
  s->sample(0, big.data());
  std::vector<int> hist(4, 0);
  for (int32_t v : big) ++hist[static_cast<size_t>(v)];
  for (int h : hist) CHECK((h > 180 && h < 320));
}

TEST_CASE("loader: Megatron's sampler slices and prefetch", "[data]") {
  std::shared_ptr<const SampleSource> src = make_mock_source(1000, 8, 99);
  const int64_t mbs = 2, dp = 3, gbs = 12, consumed = 1000;
  std::set<std::vector<int32_t>> all;
  for (int64_t r = 0; r < dp; ++r) {
    Loader l(src, mbs, r, dp);
    Batch b = l.get(consumed, gbs);
    CHECK(b.micro_batches == 2);
    CHECK(b.micro_batch_size == 2);
    REQUIRE(b.tokens.size() == static_cast<size_t>(2 * 2 * 9));
    CHECK(b.per_source_samples == std::vector<int64_t>{gbs});
    std::vector<int32_t> want(9);
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t s = 0; s < mbs; ++s) {
        src->sample(consumed + k * mbs * dp + r * mbs + s, want.data());
        std::vector<int32_t> got(b.tokens.begin() + (k * mbs + s) * 9, b.tokens.begin() + (k * mbs + s + 1) * 9);
        CHECK(got == want);
        all.insert(got);
      }
    // Prefetched batch == synchronous batch; a mismatched prefetch is ignored.
    l.prefetch(consumed + gbs, gbs);
    Batch p = l.get(consumed + gbs, gbs);
    CHECK(p.tokens == l.build(consumed + gbs, gbs).tokens);
    l.prefetch(5, gbs);
    CHECK(l.get(consumed, gbs).tokens == b.tokens);
  }
  CHECK(all.size() == static_cast<size_t>(gbs));  // the ranks cover the global batch once
  Loader l(src, mbs, 0, dp);
  CHECK_THROWS_AS(l.get(0, 10), RuntimeError);
}

TEST_CASE("loader: per-source counts cover the whole global batch of a blend", "[data]") {
  TempDir tmp("blend");
  const std::string a = (tmp / "a").string(), b = (tmp / "b").string();
  make_dataset(a, 100, 30, 0);
  make_dataset(b, 100, 30, 5000);
  std::shared_ptr<const SampleSource> src = make_blend_source(blend_spec({{3, a}, {1, b}}, 8), 0, 64, "");
  Loader l(src, 1, 1, 2);
  Batch x = l.get(0, 16);
  CHECK(x.per_source_samples == std::vector<int64_t>{12, 4});
  CHECK(x.tokens.size() == static_cast<size_t>(8 * 9));
}
