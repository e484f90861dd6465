// safetensors I/O: round trip, and the untrusted-input path — every file of the fuzz
// corpus (test/core/fuzz/corpus, grown by scripts/fuzz.sh with libFuzzer) must parse or
// throw InputError; hand-made hostile headers must be rejected before any allocation.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "core/safetensors.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;

TEST_CASE("safetensors: round trip keeps names, order, dtypes, data and metadata", "[safetensors]") {
  test::TempDir d("st");
  Tensor a = Tensor::empty({2, 3}), b = Tensor::empty({4}, DType::i32), c = Tensor::empty({1}, DType::f64);
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = 0.5f * i;
  for (int i = 0; i < 4; ++i) b.data<int32_t>()[i] = -i;
  c.data<double>()[0] = 3.25;
  safetensors::write(d.str() + "/x.safetensors", {{"z.a", a}, {"b", b}, {"c", c}}, {{"k", "v"}});
  auto f = safetensors::read(d.str() + "/x.safetensors");
  REQUIRE(f.names == std::vector<std::string>{"z.a", "b", "c"});
  CHECK(f.metadata["k"] == "v");
  CHECK(f.tensors["z.a"].shape() == Shape{2, 3});
  CHECK(f.tensors["z.a"].data<float>()[5] == 2.5f);
  CHECK(f.tensors["b"].data<int32_t>()[3] == -3);
  CHECK(f.tensors["c"].data<double>()[0] == 3.25);
}

TEST_CASE("safetensors: hostile headers are rejected with the file named", "[safetensors]") {
  auto with_header = [](const std::string& json, size_t data_bytes) {
    std::string s(8, '\0');
    uint64_t n = json.size();
    std::memcpy(s.data(), &n, 8);
    return s + json + std::string(data_bytes, '\0');
  };
  CHECK_THROWS_WITH(safetensors::parse("abc", "f.st"), Contains("f.st") && Contains("not a safetensors"));
  CHECK_THROWS_WITH(safetensors::parse(std::string(8, '\xff') + "{}", "f.st"), Contains("header length"));
  CHECK_THROWS_WITH(safetensors::parse(with_header("{not json", 0), "f.st"), Contains("not valid JSON"));
  // a shape that claims terabytes must fail on the offsets check, not allocate
  CHECK_THROWS_WITH(
      safetensors::parse(with_header(R"({"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,16]}})", 16),
                         "f.st"),
      Contains("'w'") && Contains("data_offsets"));
  CHECK_THROWS_WITH(
      safetensors::parse(with_header(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", 4), "f.st"),
      Contains("unsupported dtype"));
  CHECK_THROWS_WITH(
      safetensors::parse(with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "f.st"),
      Contains("bad dimension"));
  CHECK_THROWS_WITH(
      safetensors::parse(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,0]}})", 8), "f.st"),
      Contains("data_offsets"));
  CHECK_THROWS_WITH(safetensors::parse(with_header(R"({"w":[1,2]})", 0), "f.st"), Contains("'w'"));
}

TEST_CASE("safetensors: every fuzz-corpus input parses or throws InputError", "[safetensors]") {
  int n = 0, ok = 0;
  for (auto& e : std::filesystem::directory_iterator(test::source_dir() + "/test/core/fuzz/corpus")) {
    std::string bytes = test::read_file(e.path());
    try {
      auto f = safetensors::parse(bytes, e.path().string());
      ++ok;
      for (auto& [name, t] : f.tensors) REQUIRE(t.nbytes() <= static_cast<int64_t>(bytes.size()));
    } catch (const InputError&) {}
    ++n;
  }
  CHECK(n >= 4);
  CHECK(ok >= 1);
}
