// Curation commands under mpirun: `data quality train`, `quality filter`, `quality
// score`, `decontaminate` and `dedup` give the same output and report bytes on 1, 2, 3
// and 4 ranks (the classifier's SGD sees the examples in the one-process order; Pareto
// draws keyed by the whole file's document index; the too-common n-gram rule counted
// over the whole input; dedup's groups independent of which rank holds a document, also
// when band keys are spilled), and a bad line on a later rank's share stops every rank
// with file:line and no output. Multi-rank decontaminate draws one progress line on
// rank 0 (over both passes of all ranks) unless --no-progress.
#include <algorithm>
#include <map>
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/progress.hpp"
#include "test/support/bad_input.hpp"
#include "test/support/data_util.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using mtnlg::test::TempDir;
namespace fs = std::filesystem;

namespace {

using test::count_files;

test::RunResult run_np(int np, const std::string& args) {
  if (np == 1) return test::run_command(std::string(MTNLG_BINARY) + " " + args);
  return test::run_command("sh " + test::source_dir() + "/test/support/mpi/mpirun.sh " + std::to_string(np) + " " +
                           MTNLG_BINARY + " " + args);
}

// Runs args(np) on 1, 2, 3 and 4 ranks; read(np, result) returns what must not depend on
// the rank count (outputs, the report without timings), which must equal the 1-rank
// run's; first() checks that run's value.
template <typename T>
void same_on_1_to_4_ranks(const std::function<std::string(int)>& args,
                          const std::function<T(int, const test::RunResult&)>& read,
                          const std::function<void(const T&)>& first) {
  T ref{};
  for (int np = 1; np <= 4; ++np) {
    auto r = run_np(np, args(np));
    INFO(np << " ranks: " << r.out);
    REQUIRE(r.exit_code == 0);
    T got = read(np, r);
    if (np == 1) {
      first(got);
      ref = std::move(got);
    } else {
      CHECK(got == ref);
    }
  }
}

// A bad line inserted after the first line start past 90% of `text` (in the last of 3
// ranks' shares); returns the file's text and the line's number.
std::pair<std::string, int64_t> with_bad_line_near_end(const std::string& text, const std::string& bad) {
  std::string out = text;
  const size_t cut = out.find('\n', out.size() * 9 / 10) + 1;
  const int64_t line_no = std::count(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(cut), '\n') + 1;
  out.insert(cut, bad + "\n");
  return {out, line_no};
}

}  // namespace

TEST_CASE("e2e quality train: 1, 2, 3 and 4 ranks give a byte-identical model and report", "[data][mpi]") {
  TempDir tmp("quality-train-ranks");
  const std::string d = tmp.str();
  // 2 x 2,600 documents: with --holdout 0.1 about 4,700 train, more than one block of
  // 4,096 positions that rank 0 gathers per exchange.
  REQUIRE(test::run_mtnlg("data synth-corpus --kind quality --docs 2600 --output-dir " + d + "/q --no-progress")
              .exit_code == 0);
  // Blank lines (not documents, but lines: the error line numbers count them).
  {
    std::istringstream in(test::read_file(tmp / "q/positive.jsonl"));
    std::string text, l;
    for (int i = 0; std::getline(in, l); ++i) text += l + (i % 97 == 11 ? "\n \n" : "\n");
    test::write_file(tmp / "q/positive.jsonl", text);
  }
  auto model = [&](int np) { return d + "/m" + std::to_string(np) + ".bin"; };
  const std::string inputs = " --positive " + d + "/q/positive.jsonl --negative " + d + "/q/negative.jsonl";
  same_on_1_to_4_ranks<std::pair<std::string, nlohmann::json>>(
      [&](int np) {
        return "data quality train" + inputs + " --model " + model(np) +
               " --bucket-bits 14 --epochs 3 --holdout 0.1 --seed 3 --no-progress";
      },
      [&](int np, const test::RunResult& r) {
        if (np > 1) CHECK_THAT(r.out, Catch::Matchers::Contains(fmt::format("({} ranks)", np)));
        auto rep = nlohmann::json::parse(test::read_file(model(np) + ".report.json"));
        CHECK(rep["model"] == model(np));
        rep.erase("model");
        return std::make_pair(test::read_file(model(np)), rep);
      },
      [&](const std::pair<std::string, nlohmann::json>& got) {
        CHECK(got.first.size() == 36 + 4 * (1u << 14) + 4);  // header, weights, CRC
        const auto& docs = got.second["documents"];
        CHECK(docs["positive"] == 2600);
        CHECK(docs["negative"] == 2600);
        CHECK(docs["train"].get<int64_t>() > 4096);
        CHECK(docs["held_out"].get<int64_t>() > 300);
        CHECK(got.second["held_out_metrics"]["accuracy"].get<double>() > 0.9);  // the classes are separable
      });
  // The ranks' examples really are shuffled together: another seed, another model.
  auto other = run_np(2, "data quality train" + inputs + " --model " + d +
                             "/other.bin --bucket-bits 14 --epochs 3 "
                             "--holdout 0.1 --seed 4 --no-progress");
  REQUIRE(other.exit_code == 0);
  CHECK(test::read_file(tmp / "other.bin") != test::read_file(model(1)));

  // A malformed line in the last rank's share of --negative: exit 2 naming file:line
  // and the rank on every rank, no model written.
  const auto [bad, line_no] = with_bad_line_near_end(test::read_file(tmp / "q/negative.jsonl"), "{\"text\": [1]}");
  test::write_file(tmp / "bad.jsonl", bad);
  auto r = run_np(3, "data quality train --positive " + d + "/q/positive.jsonl --negative " + d +
                         "/bad.jsonl --model " + d + "/bad.bin --bucket-bits 14 --no-progress");
  const std::string where = "bad.jsonl:" + std::to_string(line_no);
  test::expect_exit2(r, {where.c_str(), "error on rank 2", "stopped because rank 2 failed"});
  CHECK_FALSE(fs::exists(tmp / "bad.bin"));
  CHECK_FALSE(fs::exists(tmp / "bad.bin.report.json"));
  // A bad option is reported once (by rank 0), with exit 2.
  auto opt = run_np(2, "data quality train" + inputs + " --model " + d + "/o.bin --holdout 1.5 --no-progress");
  CHECK(opt.exit_code == 2);
  CHECK_THAT(opt.out, Catch::Matchers::Contains("error on rank 0: --holdout 1.5 must be in [0, 1)"));
  CHECK_FALSE(fs::exists(tmp / "o.bin"));
}

TEST_CASE("e2e quality filter and score: 1, 2, 3 and 4 ranks give byte-identical output and report", "[data][mpi]") {
  TempDir tmp("quality-ranks");
  const std::string d = tmp.str();
  REQUIRE(
      test::run_mtnlg("data synth-corpus --kind quality --docs 200 --output-dir " + d + "/q --no-progress").exit_code ==
      0);
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
    INFO(mode);
    auto out = [&](int np) { return d + "/out" + std::to_string(np) + ".jsonl"; };
    same_on_1_to_4_ranks<std::pair<std::string, std::string>>(
        [&](int np) {
          return "data quality filter --input " + d + "/in.jsonl --model " + d + "/m.bin --output " + out(np) +
                 " --mode " + mode;
        },
        [&](int np, const test::RunResult& r) {
          CHECK_THAT(r.out, Catch::Matchers::Contains("400 documents"));
          // The report names the output file; everything else must match.
          std::string rep = test::read_file(out(np) + ".report.json");
          const std::string from = "out" + std::to_string(np) + ".jsonl", to = "out1.jsonl";
          rep.replace(rep.find(from), from.size(), to);
          return std::make_pair(test::read_file(out(np)), rep);
        },
        [&](const std::pair<std::string, std::string>& got) {
          CHECK(!got.first.empty());
          CHECK(got.first.size() < mixed.size());  // some kept, some removed
        });
  }
  // quality score: the same score lines (file line numbers) for any number of ranks.
  auto scores = [&](int np) { return d + "/scores" + std::to_string(np) + ".jsonl"; };
  same_on_1_to_4_ranks<std::string>(
      [&](int np) {
        return "data quality score --input " + d + "/in.jsonl --model " + d + "/m.bin --output " + scores(np);
      },
      [&](int np, const test::RunResult& r) {
        CHECK_THAT(r.out, Catch::Matchers::Contains("400 documents"));
        return test::read_file(scores(np));
      },
      [&](const std::string& got) {
        CHECK(std::count(got.begin(), got.end(), '\n') == 400);
        CHECK_THAT(got, Catch::Matchers::Contains("{\"line\":1,"));
      });
  // in, model, model report, q/ files aside: 4 outputs + 4 reports + 4 score files, no parts left.
  const int64_t before = count_files(tmp.path());
  CHECK(before == 3 + 4 * 3);

  // A malformed line in the last rank's share: exit 2 naming file:line, nothing written.
  const auto [bad, line_no] = with_bad_line_near_end(mixed, "{oops");
  test::write_file(tmp / "bad.jsonl", bad);
  auto r = run_np(
      3, "data quality filter --input " + d + "/bad.jsonl --model " + d + "/m.bin --output " + d + "/bad-out.jsonl");
  const std::string where = "bad.jsonl:" + std::to_string(line_no);
  test::expect_exit2(r, {where.c_str(), "rank 2"});
  CHECK(count_files(tmp.path()) == before + 1);  // only bad.jsonl
}

TEST_CASE("e2e decontaminate: 1, 2, 3 and 4 ranks give identical output and report", "[data][mpi]") {
  TempDir tmp("decontam-ranks");
  const std::string d = tmp.str();
  REQUIRE(test::run_mtnlg("data synth-corpus --output-dir " + d +
                          "/s --docs 400 --sources 1 --near-dup-fraction 0 "
                          "--partial-fraction 0 --contaminate 30 --task-rows 3 --no-progress")
              .exit_code == 0);
  // A boilerplate sentence that is also a task row, in 4 documents spread over the file:
  // with --max-hits 3 it is too common only when the ranks' counts are summed.
  const std::string boiler =
      "all rights reserved no part of this publication may be reproduced stored or transmitted in any form";
  fs::create_directories(tmp / "s/tasks/zz_boiler");
  test::write_file(tmp / "s/tasks/zz_boiler/validation.jsonl", nlohmann::json({{"text", boiler}}).dump() + "\n");
  std::vector<std::string> lines;
  {
    std::istringstream in(test::read_file(tmp / "s/pile_cc.jsonl"));
    std::string l;
    while (std::getline(in, l)) lines.push_back(l);
  }
  REQUIRE(lines.size() == 400);
  for (size_t at : {40u, 140u, 240u, 340u}) {
    auto j = nlohmann::json::parse(lines[at]);
    j["text"] = boiler + ". " + j["text"].get<std::string>();
    lines[at] = j.dump();
  }
  std::string text;
  for (size_t i = 0; i < lines.size(); ++i) text += lines[i] + (i % 50 == 7 ? "\n \n" : "\n");
  test::write_file(tmp / "in.jsonl", text);

  auto strip = [](std::string rep) {
    auto j = nlohmann::json::parse(rep);
    j.erase("seconds");
    j.erase("output");
    return j;
  };
  for (std::string mode : {"remove", "cut"}) {
    INFO(mode);
    auto out = [&](int np) { return d + "/" + mode + std::to_string(np) + ".jsonl"; };
    same_on_1_to_4_ranks<std::pair<std::string, nlohmann::json>>(
        [&](int np) {
          return "data decontaminate --input " + d + "/in.jsonl --tasks-dir " + d + "/s/tasks --output " + out(np) +
                 " --max-hits 3 --mode " + mode + " --no-progress";
        },
        [&](int np, const test::RunResult&) {
          return std::make_pair(test::read_file(out(np)), strip(test::read_file(out(np) + ".report.json")));
        },
        [&](const std::pair<std::string, nlohmann::json>& got) {
          const auto& rep = got.second;
          CHECK(rep["documents"] == 400);
          CHECK(rep["documents_hit"].get<int64_t>() >= 25);
          CHECK(rep["common_ngrams_ignored"].get<int64_t>() > 0);  // the boilerplate
          CHECK(rep["tasks"]["zz_boiler"]["docs_hit"] == 0);
        });
  }
  const int64_t before = count_files(tmp.path());
  CHECK(before == 1 + 2 * 4 * 2);  // in.jsonl + outputs and reports, no parts

  // A malformed line in the last rank's share fails pass 1 there: every rank stops.
  const auto [bad, line_no] = with_bad_line_near_end(text, "[1, 2]");
  test::write_file(tmp / "bad.jsonl", bad);
  auto r = run_np(3, "data decontaminate --input " + d + "/bad.jsonl --tasks-dir " + d + "/s/tasks --output " + d +
                         "/bad-out.jsonl --no-progress");
  const std::string where = "bad.jsonl:" + std::to_string(line_no);
  test::expect_exit2(r, {where.c_str(), "stopped because rank 2 failed"});
  CHECK(count_files(tmp.path()) == before + 1);  // only bad.jsonl

  // Progress: one line on rank 0 over both passes of all ranks' bytes (the total is
  // known, so a bar with a percentage and, while running, an ETA); --no-progress (used
  // above) draws none.
  {
    auto on = run_np(3, "data decontaminate --input " + d + "/in.jsonl --tasks-dir " + d + "/s/tasks --output " + d +
                            "/progress.jsonl --max-hits 3");
    INFO(on.out);
    REQUIRE(on.exit_code == 0);
    CHECK_THAT(on.out,
               Catch::Matchers::Contains("decontaminate: 2 passes (3 ranks): [########################] 100.0%"));
    // The total is both passes over the whole file, and every byte is counted once.
    const std::string total = human_count(2.0 * static_cast<double>(fs::file_size(tmp / "in.jsonl")));
    CHECK_THAT(on.out, Catch::Matchers::Contains(total + "/" + total + " B"));
    auto off = run_np(3, "data decontaminate --input " + d + "/in.jsonl --tasks-dir " + d + "/s/tasks --output " + d +
                             "/progress.jsonl --max-hits 3 --no-progress");
    INFO(off.out);
    REQUIRE(off.exit_code == 0);
    CHECK_THAT(off.out, !Catch::Matchers::Contains("(3 ranks): ["));
    CHECK(test::read_file(tmp / "progress.jsonl") == test::read_file(tmp / "remove1.jsonl"));
    fs::remove(tmp / "progress.jsonl");
    fs::remove(tmp / "progress.jsonl.report.json");
  }

  // --output naming the input is refused before anything is written.
  auto over = run_np(2, "data decontaminate --input " + d + "/in.jsonl --tasks-dir " + d + "/s/tasks --output " + d +
                            "/in.jsonl --no-progress");
  CHECK(over.exit_code == 2);
  CHECK_THAT(over.out, Catch::Matchers::Contains("would overwrite the input"));
  CHECK(test::read_file(tmp / "in.jsonl") == text);
}

namespace {

// The report without what may differ between runs of one corpus: timings, the run
// layout (ranks, budget, spilled runs) and the output directory in the paths.
nlohmann::json dedup_report_core(const fs::path& out_dir) {
  auto j = nlohmann::json::parse(test::read_file(out_dir / "dedup_report.json"));
  j.erase("timing_s");
  j.erase("docs_per_s");
  j.erase("run");
  for (auto& s : j["sources"]) s["output"] = fs::path(s["output"].get<std::string>()).filename().string();
  return j;
}

}  // namespace

TEST_CASE("e2e dedup: 1, 2, 3 and 4 ranks give byte-identical outputs and report; a tiny budget spills",
          "[data][mpi]") {
  TempDir tmp("dedup-ranks");
  const std::string d = tmp.str();
  REQUIRE(test::run_mtnlg("data synth-corpus --output-dir " + d + "/s --docs 900 --sources 3 --seed 5 --no-progress")
              .exit_code == 0);
  const std::vector<std::string> names = {"pile_cc.jsonl", "books3.jsonl", "wikipedia.jsonl"};
  // Blank lines here and there (not documents, never copied) in the first source.
  {
    std::istringstream in(test::read_file(tmp / "s/pile_cc.jsonl"));
    std::string text, l;
    for (int i = 0; std::getline(in, l); ++i) text += l + (i % 41 == 5 ? "\n\t\n" : "\n");
    test::write_file(tmp / "s/pile_cc.jsonl", text);
  }
  std::string inputs;
  for (auto& n : names) inputs += " " + d + "/s/" + n;
  const std::string common =
      "data dedup --input" + inputs + " --priority wikipedia --clusters --workers 1 --no-progress";

  std::map<std::string, std::string> ref;
  nlohmann::json ref_rep;
  auto check_run = [&](int np, const std::string& out, const std::string& extra) {
    auto r = run_np(np, common + " --output-dir " + d + "/" + out + extra);
    INFO(np << " ranks" << extra << ": " << r.out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Matchers::Contains("900 documents"));
    const auto rep = dedup_report_core(tmp / out);
    if (ref.empty()) {
      for (auto& n : names) ref[n] = test::read_file(tmp / out / n);
      ref["dedup_clusters.jsonl"] = test::read_file(tmp / out / "dedup_clusters.jsonl");
      ref_rep = rep;
      CHECK(rep["totals"]["removed"].get<int64_t>() > 50);  // the corpus plants ~15% near-duplicates
      CHECK(rep["sources"][0]["blank_lines"].get<int64_t>() > 0);
    } else {
      for (auto& [n, text] : ref) CHECK(test::read_file(tmp / out / n) == text);
      CHECK(rep == ref_rep);
    }
    // Only the outputs: no spill directories, no temporary files left behind.
    CHECK(count_files(tmp / out) == 5);
    int64_t entries = 0;
    for ([[maybe_unused]] auto& e : fs::directory_iterator(tmp / out)) ++entries;
    CHECK(entries == 5);
    return nlohmann::json::parse(test::read_file(tmp / out / "dedup_report.json"))["run"];
  };
  for (int np = 1; np <= 4; ++np) {
    const auto run = check_run(np, "out" + std::to_string(np), "");
    CHECK(run["ranks"] == np);
    CHECK(run["key_runs_spilled"] == 0);
    CHECK(run["key_bytes_spilled"] == 0);
    // Every rank wrote its share of the outputs (each input is split over all ranks),
    // and the shares add up to the output files.
    int64_t out_bytes = 0;
    for (auto& n : names) out_bytes += static_cast<int64_t>(fs::file_size(tmp / ("out" + std::to_string(np)) / n));
    const auto per_rank = run["output_bytes_written_per_rank"].get<std::vector<int64_t>>();
    REQUIRE(per_rank.size() == static_cast<size_t>(np));
    int64_t sum = 0;
    for (int64_t b : per_rank) {
      CHECK(b > 0);
      sum += b;
    }
    CHECK(sum == out_bytes);
  }
  // A budget far below one band's keys: every band is sorted on disk in runs and merged.
  for (int np : {1, 3}) {
    const auto run = check_run(np, "spill" + std::to_string(np), " --memory-per-rank 1K --tmp-dir " + d + "/spill");
    CHECK(run["key_runs_spilled"].get<int64_t>() > 0);
    // 64-key runs: every band's key (16 bytes) of every non-empty document went to disk.
    const auto rep = nlohmann::json::parse(test::read_file(tmp / ("spill" + std::to_string(np)) / "dedup_report.json"));
    const int64_t keyed = rep["totals"]["documents"].get<int64_t>() - rep["totals"]["empty"].get<int64_t>();
    CHECK(run["key_bytes_spilled"].get<int64_t>() == 16 * keyed * rep["params"]["bands"].get<int64_t>());
    CHECK(run["memory_per_rank"] == 1024);
  }
  CHECK((!fs::exists(tmp / "spill") || fs::is_empty(tmp / "spill")));

  // A write that fails on rank 1 of 3 after it wrote part of its share: every rank
  // stops, the failing rank names its error, the others name rank 1, exit 1 (not bad
  // input), and neither an output nor a temporary file is left.
  {
    auto w = test::run_command("MTNLG_TEST_DEDUP_FAIL_WRITE_RANK=1 sh " + test::source_dir() +
                               "/test/support/mpi/mpirun.sh 3 " + MTNLG_BINARY + " " + common + " --output-dir " + d +
                               "/wfail");
    INFO(w.out);
    CHECK(w.exit_code == 1);
    CHECK_THAT(w.out, Catch::Matchers::Contains("error on rank 1: ") && Catch::Matchers::Contains("injected") &&
                          Catch::Matchers::Contains("stopped because rank 1 failed writing the outputs"));
    REQUIRE(fs::is_directory(tmp / "wfail"));
    CHECK(fs::is_empty(tmp / "wfail"));
  }

  // A malformed line near the end of the last input is in rank 2's share of 3.
  const auto [bad, line_no] = with_bad_line_near_end(test::read_file(tmp / "s/wikipedia.jsonl"), "{\"text\": 12}");
  test::write_file(tmp / "s/wikipedia.jsonl", bad);
  auto r = run_np(3, common + " --output-dir " + d + "/bad");
  const std::string where = "wikipedia.jsonl:" + std::to_string(line_no);
  test::expect_exit2(r, {where.c_str(), "rank 2"});
  CHECK((!fs::exists(tmp / "bad") || fs::is_empty(tmp / "bad")));

  // Bad --memory-per-rank: exit 2 naming the option.
  auto m = run_np(2, common + " --output-dir " + d + "/m --memory-per-rank 2X");
  CHECK(m.exit_code == 2);
  CHECK_THAT(m.out, Catch::Matchers::Contains("--memory-per-rank 2X"));
  // A --tmp-dir that cannot be a directory is refused before any work, on every rank.
  test::write_file(tmp / "plain", "x");
  auto t = run_np(2, common + " --output-dir " + d + "/t --memory-per-rank 1K --tmp-dir " + d + "/plain/sub");
  CHECK(t.exit_code == 2);
  CHECK_THAT(t.out, Catch::Matchers::Contains("--tmp-dir") && Catch::Matchers::Contains("plain/sub"));
}
