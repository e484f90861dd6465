// Unit tests for the curation building blocks: normalisation, shingles, MinHash/LSH,
// JSONL reading, the Pareto sampler and the quality model file.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "data/curation/minhash.hpp"
#include "data/curation/quality.hpp"
#include "data/curation/text.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::curation;
using Catch::Matchers::Contains;

TEST_CASE("normalisation lower-cases, strips punctuation, collapses whitespace", "[curation]") {
  CHECK(normalize_text("Don't  STOP,\tbelieving!\n\n  U.S.A.") == "dont stop believing usa");
  CHECK(normalize_text(" ... --- ") == "");
  CHECK(normalize_text("Caf\xc3\xa9 na\xc3\xafve") == "caf\xc3\xa9 na\xc3\xafve");  // UTF-8 kept
  std::vector<Word> w;
  normalize_words("  Hello, world", w);
  REQUIRE(w.size() == 2);
  CHECK(w[0].begin == 2);
  CHECK(w[0].end == 8);  // "Hello," incl. the comma: cut mode removes whole tokens
  CHECK(w[1].begin == 9);
  std::vector<Word> a, b;
  normalize_words("THE cat!", a);
  normalize_words("the   cat", b);
  CHECK(a[0].hash == b[0].hash);
  CHECK(a[1].hash == b[1].hash);
}

TEST_CASE("shingles: n-grams, short documents, empty documents", "[curation]") {
  std::vector<Word> w;
  std::vector<uint64_t> s;
  normalize_words("a b c d e f", w);
  shingle_hashes(w, 5, s);
  CHECK(s.size() == 2);
  normalize_words("a b c", w);
  shingle_hashes(w, 5, s);
  CHECK(s.size() == 1);  // shorter than n: one shingle of all words
  std::vector<uint64_t> s2;
  normalize_words("A, B; C!", w);
  shingle_hashes(w, 5, s2);
  CHECK(s2 == s);
  normalize_words("  ?! ", w);
  shingle_hashes(w, 5, s);
  CHECK(s.empty());
  // Order matters.
  std::vector<uint64_t> x, y;
  normalize_words("one two three four five", w);
  shingle_hashes(w, 5, x);
  normalize_words("five four three two one", w);
  shingle_hashes(w, 5, y);
  CHECK(x != y);
}

TEST_CASE("LSH banding for the threshold keeps recall at the threshold", "[curation]") {
  LshParams p = choose_bands(0.8, 128);
  CHECK(p.rows == 7);
  CHECK(p.bands == 18);
  CHECK(lsh_candidate_probability(0.8, p.bands, p.rows) >= 0.98);
  CHECK(lsh_candidate_probability(0.3, p.bands, p.rows) < 0.01);
  // A higher threshold allows more rows per band.
  CHECK(choose_bands(0.9, 128).rows > p.rows);
  CHECK_THROWS_AS(choose_bands(1.5, 128), InputError);
}

TEST_CASE("MinHash estimates the Jaccard similarity", "[curation]") {
  MinHasher h(256, 7);
  // Sets {0..999} and {k..999+k}: Jaccard (1000-k)/(1000+k).
  for (int k : {0, 100, 300, 700}) {
    std::vector<uint64_t> a, b;
    for (int i = 0; i < 1000; ++i) a.push_back(mix64(static_cast<uint64_t>(i)));
    for (int i = k; i < 1000 + k; ++i) b.push_back(mix64(static_cast<uint64_t>(i)));
    std::vector<uint32_t> sa(256), sb(256);
    h.signature(a.data(), static_cast<int64_t>(a.size()), sa.data());
    h.signature(b.data(), static_cast<int64_t>(b.size()), sb.data());
    double exact = exact_jaccard(a, b);
    CHECK(exact == Approx((1000.0 - k) / (1000.0 + k)));
    CHECK(std::fabs(estimate_jaccard(sa.data(), sb.data(), 256) - exact) < 0.1);
  }
  // Same seed, same signature; another seed, another one.
  std::vector<uint64_t> a = {1, 2, 3};
  std::vector<uint32_t> s1(16), s2(16), s3(16);
  MinHasher(16, 1).signature(a.data(), 3, s1.data());
  MinHasher(16, 1).signature(a.data(), 3, s2.data());
  MinHasher(16, 2).signature(a.data(), 3, s3.data());
  CHECK(s1 == s2);
  CHECK(s1 != s3);
}

TEST_CASE("LineReader returns lines byte-exact, last line without newline", "[curation]") {
  test::TempDir dir("curation-lines");
  test::write_file(dir / "a.jsonl", "one\r\n\ntwo\nthree");
  LineReader r((dir / "a.jsonl").string());
  std::string line;
  int64_t no = 0;
  std::vector<std::string> got;
  while (r.next(line, no)) got.push_back(line);
  REQUIRE(got.size() == 4);
  CHECK(got[0] == "one\r");
  CHECK(is_blank_line(got[1]));
  CHECK(got[3] == "three");
  CHECK(no == 4);
  // A line longer than the 1 MiB buffer.
  std::string big(3 << 20, 'x');
  test::write_file(dir / "b.jsonl", "{\"text\":\"" + big + "\"}\nend\n");
  LineReader rb((dir / "b.jsonl").string());
  REQUIRE(rb.next(line, no));
  CHECK(extract_text(line, "text", "b.jsonl", no) == big);
  REQUIRE(rb.next(line, no));
  CHECK(line == "end");
}

TEST_CASE("extract_text names file:line and the problem", "[curation]") {
  CHECK(extract_text(R"({"text": "hi", "n": 1})", "text", "f.jsonl", 1) == "hi");
  CHECK_THROWS_WITH(extract_text("{\"text\": ", "text", "f.jsonl", 3), Contains("f.jsonl:3") && Contains("malformed"));
  CHECK_THROWS_WITH(extract_text(R"({"body": "x"})", "text", "f.jsonl", 4), Contains("f.jsonl:4") && Contains("body"));
  CHECK_THROWS_WITH(extract_text(R"({"text": 5})", "text", "f.jsonl", 5), Contains("f.jsonl:5") && Contains("string"));
  CHECK_THROWS_AS(extract_text("[1,2]", "text", "f.jsonl", 6), InputError);
}

TEST_CASE("Pareto sampler follows numpy.random.pareto's keep rate", "[curation]") {
  // P(draw > 1 - s) = (2 - s)^-alpha for the Lomax draw numpy uses.
  for (double s : {0.2, 0.5, 0.9}) {
    int64_t keep = 0, n = 200000;
    for (int64_t i = 0; i < n; ++i) keep += pareto_draw(3, static_cast<uint64_t>(i), 9.0) > 1.0 - s;
    double want = std::pow(2.0 - s, -9.0);
    double se = std::sqrt(want * (1 - want) / static_cast<double>(n));
    CHECK(std::fabs(static_cast<double>(keep) / static_cast<double>(n) - want) < 5 * se + 1e-4);
  }
  CHECK(pareto_draw(3, 17, 9.0) == pareto_draw(3, 17, 9.0));
  CHECK(pareto_draw(3, 17, 9.0) != pareto_draw(4, 17, 9.0));
}

TEST_CASE("quality model file: round trip, corruption is an input error", "[curation]") {
  test::TempDir dir("curation-model");
  QualityModel m(12, 99);
  std::vector<uint32_t> f;
  m.features("the quiet river crossed the old bridge", f);
  for (int i = 0; i < 20; ++i) m.sgd_step(f, 1, 0.5);
  std::string path = (dir / "m.bin").string();
  m.save(path);
  QualityModel l = QualityModel::load(path);
  CHECK(l.bucket_bits() == 12);
  CHECK(l.score("the quiet river crossed the old bridge") == m.score("the quiet river crossed the old bridge"));
  CHECK(l.score("the quiet river crossed the old bridge") > 0.9);

  std::string bytes = test::read_file(path);
  std::string bad = bytes;
  bad[100] = static_cast<char>(bad[100] ^ 0x40);
  test::write_file(dir / "bad.bin", bad);
  CHECK_THROWS_WITH(QualityModel::load((dir / "bad.bin").string()), Contains("checksum"));
  test::write_file(dir / "short.bin", bytes.substr(0, bytes.size() - 10));
  CHECK_THROWS_AS(QualityModel::load((dir / "short.bin").string()), InputError);
  test::write_file(dir / "junk.bin", "hello");
  CHECK_THROWS_WITH(QualityModel::load((dir / "junk.bin").string()), Contains("magic"));
  CHECK_THROWS_AS(QualityModel::load((dir / "missing.bin").string()), InputError);
}

TEST_CASE("Pareto keep rule matches numpy.random.pareto (oracle)", "[oracle][curation]") {
  if (!test::python_has("numpy")) {
    WARN("numpy not available to " << test::python() << "; skipped");
    return;
  }
  // numpy's pareto is the Lomax (Pareto II) draw; GPT-3 kept a document when
  // np.random.pareto(9) > 1 - score. Compare keep rates at several scores.
  auto r = test::run_command(test::python() +
                             " -c 'import numpy as np; x=np.random.RandomState(0).pareto(9.0, 400000); "
                             "print(\" \".join(str(float(np.mean(x > 1 - s))) for s in (0.1, 0.5, 0.8, 0.95)))'");
  REQUIRE(r.exit_code == 0);
  std::istringstream in(r.out);
  const int64_t n = 400000;
  for (double s : {0.1, 0.5, 0.8, 0.95}) {
    double numpy_rate = 0;
    in >> numpy_rate;
    int64_t keep = 0;
    for (int64_t i = 0; i < n; ++i) keep += pareto_draw(11, static_cast<uint64_t>(i), 9.0) > 1.0 - s;
    double ours = static_cast<double>(keep) / static_cast<double>(n);
    double se = std::sqrt(numpy_rate * (1 - numpy_rate) / static_cast<double>(n));
    INFO("score " << s << ": numpy " << numpy_rate << ", ours " << ours);
    CHECK(std::fabs(ours - numpy_rate) < 6 * std::sqrt(2.0) * se + 1e-5);
  }
}
