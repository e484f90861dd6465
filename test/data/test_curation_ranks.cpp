// Curation commands under mpirun: `data quality filter` gives the same output and report
// bytes on 1, 2, 3 and 4 ranks (Pareto draws keyed by the whole file's document index),
// and a bad line on a later rank's share stops every rank with file:line and no output.
#include <catch2/catch.hpp>
#include <filesystem>

#include "test/support/test_support.hpp"

using namespace mtnlg;
using mtnlg::test::TempDir;
namespace fs = std::filesystem;

namespace {

int64_t count_files(const fs::path& dir) {
  int64_t n = 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

test::RunResult run_np(int np, const std::string& args) {
  if (np == 1) return test::run_command(std::string(MTNLG_BINARY) + " " + args);
  return test::run_command("sh " + test::source_dir() + "/test/mpi/mpirun.sh " + std::to_string(np) + " " +
                           MTNLG_BINARY + " " + args);
}

}  // namespace

TEST_CASE("e2e quality filter: 1, 2, 3 and 4 ranks give byte-identical output and report", "[data][mpi]") {
  TempDir tmp("quality-ranks");
  const std::string d = tmp.str();
  REQUIRE(test::run_mtnlg("data synth-corpus --kind quality --docs 200 --output-dir " + d + "/q --no-progress").exit_code == 0);
  auto tr = test::run_mtnlg("data quality train --positive " + d + "/q/positive.jsonl --negative " + d +
                            "/q/negative.jsonl --model " + d + "/m.bin --bucket-bits 14 --epochs 1 --no-progress");
  INFO(tr.out);
  REQUIRE(tr.exit_code == 0);
  // Mixed input: positives and negatives alternating, a blank line now and then.
  const std::string pos = test::read_file(tmp / "q/positive.jsonl"), neg = test::read_file(tmp / "q/negative.jsonl");
  std::string mixed;
  size_t a = 0, b = 0;
  for (int i = 0; a < pos.size() || b < neg.size(); ++i) {
    const std::string& src = (i % 2 == 0 && a < pos.size()) || b >= neg.size() ? pos : neg;
    size_t& at = &src == &pos ? a : b;
    const size_t nl = src.find('\n', at);
    mixed += src.substr(at, nl - at + 1);
    at = nl + 1;
    if (i % 37 == 3) mixed += "  \n";
  }
  test::write_file(tmp / "in.jsonl", mixed);

  for (std::string mode : {"pareto --alpha 3", "threshold --threshold 0.5"}) {
    std::string ref_out, ref_rep;
    for (int np = 1; np <= 4; ++np) {
      const std::string out = d + "/out" + std::to_string(np) + ".jsonl";
      auto r = run_np(np, "data quality filter --input " + d + "/in.jsonl --model " + d + "/m.bin --output " + out +
                              " --mode " + mode);
      INFO(mode << ", " << np << " ranks: " << r.out);
      REQUIRE(r.exit_code == 0);
      CHECK_THAT(r.out, Catch::Matchers::Contains("400 documents"));
      const std::string got = test::read_file(out), rep = test::read_file(out + ".report.json");
      if (np == 1) {
        ref_out = got;
        ref_rep = rep;
        CHECK(!got.empty());
        CHECK(got.size() < mixed.size());  // some kept, some removed
      } else {
        CHECK(got == ref_out);
        // The report names the output file; everything else must match.
        CHECK(rep.size() == ref_rep.size());
        std::string norm = rep;
        const std::string from = "out" + std::to_string(np) + ".jsonl", to = "out1.jsonl";
        norm.replace(norm.find(from), from.size(), to);
        CHECK(norm == ref_rep);
      }
    }
  }
  // in, model, model report, q/ files aside: 4 outputs + 4 reports, no parts left.
  const int64_t before = count_files(tmp.path());
  CHECK(before == 3 + 4 * 2);

  // A malformed line in the last rank's share: exit 2 naming file:line, nothing written.
  std::string bad = mixed;
  size_t cut = bad.size() * 9 / 10;
  cut = bad.find('\n', cut) + 1;
  const int64_t line_no = std::count(bad.begin(), bad.begin() + static_cast<std::ptrdiff_t>(cut), '\n') + 1;
  bad.insert(cut, "{oops\n");
  test::write_file(tmp / "bad.jsonl", bad);
  auto r = run_np(3, "data quality filter --input " + d + "/bad.jsonl --model " + d + "/m.bin --output " + d +
                         "/bad-out.jsonl");
  INFO(r.out);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("bad.jsonl:" + std::to_string(line_no)) &&
                        Catch::Matchers::Contains("rank 2"));
  CHECK(count_files(tmp.path()) == before + 1);  // only bad.jsonl
}
