// Straggler detection through the binary (docs/RELIABILITY.md, "Stragglers"): four
// data-parallel ranks, one made slow by MTNLG_FAULT_INJECT mode=slow, must be named in
// one warning (rank, host, coordinates) within logging.straggler_intervals log intervals
// of the slowdown, and no other rank; metrics.jsonl carries the slowest rank per interval
// and `mtnlg report` names the flagged rank. A run without the fault names nobody.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "app/train/straggler.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;

namespace {

constexpr int kSlowRank = 2, kSlowFrom = 4, kIntervals = 3;

struct Row {
  int64_t iteration, slowest, flagged;
  double ratio;
};
std::vector<Row> read_rows(const fs::path& run) {
  std::vector<Row> rows;
  for (const auto& j : test::read_iteration_records(run))
    rows.push_back({j["iteration"].get<int64_t>(), j.value("slowest_rank", int64_t{-1}),
                    j.value("straggler_rank", int64_t{-1}), j.value("slowest_ratio", 0.0)});
  return rows;
}

test::RunResult train(const test::TempDir& run, const std::string& env) {
  const std::string recipe = test::source_dir() + "/recipes/tiny-mock.yaml";
  const std::string sets = "--set training.train_iters=10 --set training.num_threads=1 --set logging.log_interval=1";
  auto r = test::run_train(recipe, run.str(), sets, 4, env);
  UNSCOPED_INFO(test::train_command(recipe, run.str(), sets, 4, env) << "\n" << r.out);
  return r;
}

// The ranks named by "warning: straggler: rank R (" lines.
std::vector<int> named_ranks(const std::string& out) {
  std::vector<int> ranks;
  const std::regex re("warning: straggler: rank ([0-9]+) \\(tp=0,pp=0,dp=([0-9]+) host [^)]+\\)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
    ranks.push_back(std::stoi((*it)[1]));
    CHECK((*it)[2] == (*it)[1]);  // dp4: the dp coordinate is the rank
  }
  return ranks;
}

}  // namespace

TEST_CASE("straggler detection names a slowed rank once and only it; a clean run names nobody", "[mpi][straggler]") {
  SECTION("rank 2 sleeps 300 ms per iteration from iteration 4") {
    test::TempDir run("straggler-slow");
    const auto r = train(run, "MTNLG_FAULT_INJECT=rank=2:iteration=4:mode=slow:ms=300");
    REQUIRE(r.exit_code == 0);
    CHECK(named_ranks(r.out) == std::vector<int>{kSlowRank});  // one warning: once per episode
    const auto rows = read_rows(run.path());
    REQUIRE(rows.size() == 10);
    int64_t first_flag = -1;
    for (const auto& row : rows) {
      INFO("iteration " << row.iteration << " slowest " << row.slowest << " ratio " << row.ratio);
      CHECK(row.slowest >= 0);
      if (row.iteration >= kSlowFrom) {
        CHECK(row.slowest == kSlowRank);
        CHECK(row.ratio > 2.0);
      }
      CHECK((row.flagged == -1 || row.flagged == kSlowRank));
      if (row.flagged == kSlowRank && first_flag < 0) first_flag = row.iteration;
    }
    CHECK(first_flag == kSlowFrom + kIntervals - 1);  // within straggler_intervals intervals of the slowdown
    CHECK(rows.back().flagged == kSlowRank);          // named until the end (the slowdown lasts)
    // The report's summary row names the rank and the iterations.
    const auto rep = test::run_mtnlg("report " + run.str());
    INFO(rep.out);
    REQUIRE(rep.exit_code == 0);
    std::ifstream html(run.path() / "report.html");
    const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
    CHECK(page.find("Stragglers flagged") != std::string::npos);
    CHECK(page.find("rank 2 at iterations 6-10") != std::string::npos);
  }
  SECTION("no fault: nobody is named") {
    test::TempDir run("straggler-clean");
    const auto r = train(run, "");
    REQUIRE(r.exit_code == 0);
    CHECK(named_ranks(r.out).empty());
    CHECK(r.out.find("straggler") == std::string::npos);
    for (const auto& row : read_rows(run.path())) CHECK(row.flagged == -1);
  }
}

// The decision alone (app/train/straggler.hpp), on given per-rank times: the slowest
// rank is reported every interval; a rank is named once per episode, only after
// `intervals` intervals in a row over the margin and by at least kMinExcessS; the
// episode ends when it falls back in line.
TEST_CASE("straggler tracker: margin, intervals in a row, once per episode, the minimum excess", "[straggler]") {
  app::StragglerTracker t(4, /*margin=*/1.2, /*intervals=*/2);
  const std::vector<double> even{1.0, 1.0, 1.0, 1.0}, slow2{1.0, 1.0, 1.5, 1.0};
  auto v = t.update(even);
  CHECK(v.named.empty());
  CHECK(v.straggler_rank == -1);
  v = t.update(slow2);  // first interval over the margin: not yet
  CHECK(v.slowest_rank == 2);
  CHECK(v.slowest_ratio == Approx(1.5));
  CHECK(v.named.empty());
  v = t.update(slow2);  // second in a row: named
  REQUIRE(v.named.size() == 1);
  CHECK(v.named[0].rank == 2);
  CHECK(v.named[0].intervals == 2);
  CHECK(v.named[0].median == Approx(1.0));
  CHECK(v.straggler_rank == 2);
  v = t.update(slow2);  // the same episode: not named again, still the straggler
  CHECK(v.named.empty());
  CHECK(v.straggler_rank == 2);
  v = t.update(even);  // back in line: the episode is over
  CHECK(v.straggler_rank == -1);
  t.update(slow2);
  v = t.update(slow2);  // a new episode is named again
  REQUIRE(v.named.size() == 1);
  // Over the margin but by less than kMinExcessS (millisecond steps): never named.
  app::StragglerTracker fast(2 + 1, 1.2, 1);
  const std::vector<double> ms{0.010, 0.010, 0.020};
  CHECK(fast.update(ms).named.empty());
  CHECK(fast.update(ms).slowest_rank == 2);
}
