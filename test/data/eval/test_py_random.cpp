// CPython random.Random twin (data/eval/py_random.hpp): the spec's test vectors
// (eval-harness.md §3.3) exactly, and a longer comparison against CPython itself.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "core/error.hpp"
#include "data/eval/py_random.hpp"
#include "test/support/test_support.hpp"

using mtnlg::data::eval::PyRandom;

TEST_CASE("py_random: Random(42) getrandbits and random() match CPython", "[eval]") {
  PyRandom r(42);
  CHECK(r.getrandbits(32) == 2746317213u);
  CHECK(r.getrandbits(32) == 478163327u);
  CHECK(r.getrandbits(32) == 107420369u);
  PyRandom r2(42);
  CHECK(r2.random() == 0.6394267984578837);
  PyRandom r0(0);
  CHECK(r0.random() == 0.8444218515250481);
}

TEST_CASE("py_random: shuffle then sample on the same object (the v0.3 order)", "[eval]") {
  PyRandom r(42);
  std::vector<int> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  r.shuffle(x);
  CHECK(x == std::vector<int>{7, 3, 2, 8, 5, 6, 9, 4, 0, 1});
  CHECK(r.sample_indices(40398, 5) == std::vector<int64_t>{38698, 27651, 2082, 1952, 6140});
}

TEST_CASE("py_random: Random(1234).sample and Random(0).choices", "[eval]") {
  PyRandom r(1234);
  CHECK(r.sample_indices(9427, 3) == std::vector<int64_t>{7220, 1914, 122});
  PyRandom c(0);
  CHECK(c.choices_indices(100, 5) == std::vector<int64_t>{84, 75, 42, 25, 51});
}

TEST_CASE("py_random: sampling larger than the population is an input error", "[eval]") {
  PyRandom r(1);
  CHECK_THROWS_AS(r.sample_indices(3, 4), mtnlg::InputError);
  CHECK(r.sample_indices(3, 3).size() == 3);
}

TEST_CASE("py_random: agrees with CPython on seeds, pool/set sampling and big ranges", "[oracle]") {
  // Both sample() branches (pool: n <= setsize, set: n > setsize), k > 5 setsize
  // growth, getrandbits > 32 bits, and negative / multi-word seeds.
  const std::string py =
      "import random\n"
      "out=[]\n"
      "for seed in [0, 1, 42, 1234, -7, 2**40+3]:\n"
      "  r=random.Random(seed)\n"
      "  out.append(r.sample(range(30), 12)); out.append(r.sample(range(100), 7)); out.append(r.sample(range(5), 5))\n"
      "  l=list(range(17)); r.shuffle(l); out.append(l)\n"
      "  out.append([r.getrandbits(45), r.getrandbits(64), r.randrange(10**12)])\n"
      "print(repr(out).replace(' ',''))\n";
  mtnlg::test::TempDir dir("pyrandom");
  mtnlg::test::write_file(dir / "r.py", py);
  auto res = mtnlg::test::run_command(mtnlg::test::python() + " " + (dir / "r.py").string());
  REQUIRE(res.exit_code == 0);
  std::string ours = "[";
  auto list = [&](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(v[i]);
    }
    return s + "]";
  };
  bool first = true;
  for (int64_t seed : {int64_t(0), int64_t(1), int64_t(42), int64_t(1234), int64_t(-7), (int64_t(1) << 40) + 3}) {
    PyRandom r(seed);
    std::vector<std::string> parts = {list(r.sample_indices(30, 12)), list(r.sample_indices(100, 7)),
                                      list(r.sample_indices(5, 5))};
    std::vector<int64_t> l(17);
    for (int i = 0; i < 17; ++i) l[i] = i;
    r.shuffle(l);
    parts.push_back(list(l));
    int64_t a = static_cast<int64_t>(r.getrandbits(45));
    uint64_t b = r.getrandbits(64);
    int64_t c = static_cast<int64_t>(r.randbelow(1000000000000ull));
    parts.push_back(fmt::format("[{},{},{}]", a, b, c));
    for (auto& p : parts) {
      ours += (first ? "" : ",") + p;
      first = false;
    }
  }
  ours += "]";
  std::string theirs = res.out;
  while (!theirs.empty() && (theirs.back() == '\n' || theirs.back() == '\r')) theirs.pop_back();
  CHECK(ours == theirs);
}
