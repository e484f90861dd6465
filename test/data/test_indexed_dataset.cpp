// Megatron .bin/.idx: byte-exact layout, reader validation, and cross-checks with an
// independent numpy implementation (test/data/megatron_idx.py).
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "data/indexed_dataset.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::data;
using mtnlg::test::TempDir;

namespace {

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Three documents: [5, 6, 7], [] (empty), [50256] as one sequence each, plus a
// two-sequence document [1, 2] + [3].
void write_sample(const std::string& prefix) {
  IndexedDatasetWriter w(prefix, DType::u16);
  std::vector<int32_t> a{5, 6, 7}, c{50256}, d{1, 2, 3};
  std::vector<int64_t> dl{2, 1};
  w.add_document(a);
  w.add_document(std::span<const int32_t>{});
  w.add_document(c);
  w.add_document(d, dl);
  w.finalize();
}

void expect_input_error(const std::string& prefix, const std::string& part1, const std::string& part2) {
  try {
    IndexedDataset ds(prefix);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Matchers::Contains(part1));
    CHECK_THAT(e.what(), Catch::Matchers::Contains(part2));
  }
}

}  // namespace

TEST_CASE("indexed dataset: writer output is byte-exact to Megatron's layout", "[data]") {
  TempDir tmp("idx");
  const std::string prefix = (tmp / "s_text_document").string();
  write_sample(prefix);

  std::string bin;
  for (uint16_t v : {5, 6, 7, 50256, 1, 2, 3}) put<uint16_t>(bin, v);
  CHECK(test::read_file(prefix + ".bin") == bin);

  std::string idx("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, 8);
  put<uint64_t>(idx, 4);  // sequences
  put<uint64_t>(idx, 5);  // document indices = docs + 1
  for (int32_t l : {3, 1, 2, 1}) put<int32_t>(idx, l);
  for (int64_t p : {0, 6, 8, 12}) put<int64_t>(idx, p);
  for (int64_t d : {0, 1, 1, 2, 4}) put<int64_t>(idx, d);
  CHECK(test::read_file(prefix + ".idx") == idx);
  // Nothing temporary left behind.
  int64_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(tmp.path())) files += e.is_regular_file();
  CHECK(files == 2);
}

TEST_CASE("indexed dataset: reader returns what was written", "[data]") {
  TempDir tmp("idx");
  const std::string prefix = (tmp / "s").string();
  write_sample(prefix);
  IndexedDataset ds(prefix);
  CHECK(ds.dtype() == DType::u16);
  CHECK(ds.num_sequences() == 4);
  CHECK(ds.num_documents() == 4);
  CHECK(ds.num_tokens() == 7);
  CHECK(ds.get(0) == std::vector<int32_t>{5, 6, 7});
  CHECK(ds.get(1) == std::vector<int32_t>{50256});
  CHECK(ds.document_indices() == std::vector<int64_t>{0, 1, 1, 2, 4});
  int32_t two[2];
  ds.read(2, 0, 2, two);
  CHECK(two[0] == 1);
  CHECK(two[1] == 2);
  CHECK_THROWS_AS(ds.read(2, 1, 2, two), RuntimeError);
}

TEST_CASE("indexed dataset: int32 dtype for large vocabularies", "[data]") {
  CHECK(dtype_for_vocab(50257) == DType::u16);
  CHECK(dtype_for_vocab(65499) == DType::u16);
  CHECK(dtype_for_vocab(65500) == DType::i32);
  TempDir tmp("idx");
  const std::string prefix = (tmp / "w").string();
  {
    IndexedDatasetWriter w(prefix, DType::i32);
    std::vector<int32_t> a{70000, 1, 99999};
    w.add_document(a);
    w.finalize();
  }
  IndexedDataset ds(prefix);
  CHECK(ds.dtype() == DType::i32);
  CHECK(ds.get(0) == std::vector<int32_t>{70000, 1, 99999});
}

TEST_CASE("indexed dataset: a writer that is not finalized leaves nothing", "[data]") {
  TempDir tmp("idx");
  const std::string prefix = (tmp / "x").string();
  {
    IndexedDatasetWriter w(prefix, DType::u16);
    std::vector<int32_t> a{1, 2};
    w.add_document(a);
    std::vector<int32_t> bad{70000};
    CHECK_THROWS_AS(w.add_document(bad), InputError);  // does not fit uint16
  }
  CHECK(std::filesystem::is_empty(tmp.path()));
}

TEST_CASE("indexed dataset: corrupt, truncated and foreign files are InputErrors naming the file", "[data]") {
  TempDir tmp("idx");
  const std::string prefix = (tmp / "s").string();
  write_sample(prefix);
  const std::string idx = test::read_file(prefix + ".idx"), bin = test::read_file(prefix + ".bin");
  auto restore = [&] {
    test::write_file(prefix + ".idx", idx);
    test::write_file(prefix + ".bin", bin);
  };

  SECTION("missing files") {
    expect_input_error((tmp / "nope").string(), "nope.idx", "not found");
    std::filesystem::remove(prefix + ".bin");
    expect_input_error(prefix, "s.bin", "not found");
  }
  SECTION("truncated .bin") {
    test::write_file(prefix + ".bin", bin.substr(0, bin.size() - 2));
    expect_input_error(prefix, "s.bin", "truncated");
  }
  SECTION(".bin longer than the index says") {
    test::write_file(prefix + ".bin", bin + std::string(4, '\0'));
    expect_input_error(prefix, "s.bin", "does not belong");
  }
  SECTION("truncated .idx") {
    test::write_file(prefix + ".idx", idx.substr(0, idx.size() - 8));
    expect_input_error(prefix, "s.idx", "truncated");
    test::write_file(prefix + ".idx", idx.substr(0, 20));
    expect_input_error(prefix, "s.idx", "truncated");
  }
  SECTION("foreign file") {
    test::write_file(prefix + ".idx", std::string("{\"not\": \"an index\"}\n"));
    expect_input_error(prefix, "s.idx", "magic");
    test::write_file(prefix + ".idx", std::string("TNTIDX\0\0", 8) + std::string(40, '\0'));
    expect_input_error(prefix, "s.idx", "TNTIDX");
  }
  SECTION("wrong version and dtype") {
    std::string v = idx;
    v[9] = 2;
    test::write_file(prefix + ".idx", v);
    expect_input_error(prefix, "s.idx", "version 2");
    restore();
    std::string d = idx;
    d[17] = 9;
    test::write_file(prefix + ".idx", d);
    expect_input_error(prefix, "s.idx", "dtype code 9");
  }
  SECTION("inconsistent pointers and document indices") {
    std::string p = idx;
    const int64_t bad = 7;
    std::memcpy(p.data() + 34 + 16 + 8, &bad, 8);  // pointer of sequence 1
    test::write_file(prefix + ".idx", p);
    expect_input_error(prefix, "s.idx", "sequence 1 points at byte 7");
    restore();
    std::string q = idx;
    const int64_t three = 3;
    std::memcpy(q.data() + 34 + 48 + 8 * 4, &three, 8);  // last document index
    test::write_file(prefix + ".idx", q);
    expect_input_error(prefix, "s.idx", "last document index is 3");
  }
  SECTION("huge counts in the header do not overflow") {
    std::string h = idx;
    const uint64_t n = ~0ull / 3;
    std::memcpy(h.data() + 18, &n, 8);
    test::write_file(prefix + ".idx", h);
    expect_input_error(prefix, "s.idx", "do not fit");
  }
}

TEST_CASE("indexed dataset: numpy reader reads our files, we read numpy's", "[data][oracle]") {
  if (!test::python_has("numpy")) {
    WARN("skipped: " << test::python() << " has no numpy");
    return;
  }
  TempDir tmp("idx-oracle");
  const std::string script = test::source_dir() + "/test/data/megatron_idx.py";
  // Ours -> numpy.
  const std::string prefix = (tmp / "ours").string();
  write_sample(prefix);
  auto r = test::run_command(test::python() + " " + script + " dump " + prefix);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["dtype"] == 8);
  CHECK(j["lengths"] == nlohmann::json::array({3, 1, 2, 1}));
  CHECK(j["doc_idx"] == nlohmann::json::array({0, 1, 1, 2, 4}));
  CHECK(j["tokens"] == nlohmann::json::parse("[[5,6,7],[50256],[1,2],[3]]"));

  // numpy -> ours, for uint16 and int32, with empty documents at both ends.
  for (int code : {8, 4}) {
    nlohmann::json docs = nlohmann::json::parse("[[], [[1,2,3]], [[4],[5,6]], [], [[60000, 0]], []]");
    test::write_file(tmp / "docs.json", docs.dump());
    const std::string theirs = (tmp / ("theirs" + std::to_string(code))).string();
    auto w = test::run_command(test::python() + " " + script + " write " + theirs + " " + (tmp / "docs.json").string() +
                               " " + std::to_string(code));
    REQUIRE(w.exit_code == 0);
    IndexedDataset ds(theirs);
    CHECK(static_cast<int>(ds.dtype()) == code);
    CHECK(ds.num_documents() == 6);
    CHECK(ds.num_sequences() == 4);
    CHECK(ds.document_indices() == std::vector<int64_t>{0, 0, 1, 3, 3, 4, 4});
    CHECK(ds.get(2) == std::vector<int32_t>{5, 6});
    CHECK(ds.get(3) == std::vector<int32_t>{60000, 0});
    // And our writer produces the same bytes for the same documents.
    const std::string mine = (tmp / ("mine" + std::to_string(code))).string();
    {
      IndexedDatasetWriter wr(mine, static_cast<DType>(code));
      for (const auto& doc : docs) {
        std::vector<int32_t> ids;
        std::vector<int64_t> lens;
        for (const auto& seq : doc) {
          for (int v : seq) ids.push_back(v);
          lens.push_back(static_cast<int64_t>(seq.size()));
        }
        wr.add_document(ids, lens);
      }
      wr.finalize();
    }
    CHECK(test::read_file(mine + ".idx") == test::read_file(theirs + ".idx"));
    CHECK(test::read_file(mine + ".bin") == test::read_file(theirs + ".bin"));
  }
}
