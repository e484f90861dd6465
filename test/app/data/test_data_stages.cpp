// [e2e] The curation commands through the mtnlg binary: exit codes and messages.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
using nlohmann::json;

TEST_CASE("mtnlg data curation commands end to end", "[e2e][curation]") {
  test::TempDir dir("curation-e2e");
  std::string d = dir.str();
  auto help = test::run_mtnlg("data --help");
  CHECK(help.exit_code == 0);
  for (const char* c : {"dedup", "quality", "decontaminate", "synth-corpus"}) CHECK_THAT(help.out, Contains(c));

  auto gen = test::run_mtnlg("data synth-corpus --output-dir " + d +
                             "/c --docs 600 --sources 2 --contaminate 9 --no-progress");
  REQUIRE(gen.exit_code == 0);
  auto dd = test::run_mtnlg("data dedup --input " + d + "/c/pile_cc.jsonl " + d + "/c/books3.jsonl --output-dir " + d +
                            "/out --priority books3 --workers 2 --no-progress");
  INFO(dd.out);
  REQUIRE(dd.exit_code == 0);
  json rep = json::parse(test::read_file(dir / "out" / "dedup_report.json"));
  CHECK(rep["totals"]["documents"] == 600);
  CHECK(rep["totals"]["removed"].get<int64_t>() > 20);
  CHECK(rep["params"]["priority"] == json::array({"books3"}));

  auto dc = test::run_mtnlg("data decontaminate --input " + d + "/c/pile_cc.jsonl --tasks-dir " + d +
                            "/c/tasks --output " + d + "/clean.jsonl --no-progress");
  INFO(dc.out);
  REQUIRE(dc.exit_code == 0);
  CHECK(json::parse(test::read_file(dir / "clean.jsonl.report.json"))["tasks"].size() == 9);

  // Bad input: exit 2 with a one-line message naming the place.
  auto bad_prio =
      test::run_mtnlg("data dedup --input " + d + "/c/pile_cc.jsonl --output-dir " + d + "/o2 --priority wiki");
  CHECK(bad_prio.exit_code == 2);
  CHECK_THAT(bad_prio.out, Contains("\"wiki\"") && Contains("pile_cc"));
  test::write_file(dir / "bad.jsonl", "{\"text\": \"a\"}\n{\"text\": \n");
  auto bad_json = test::run_mtnlg("data dedup --input " + d + "/bad.jsonl --output-dir " + d + "/o3 --no-progress");
  CHECK(bad_json.exit_code == 2);
  CHECK_THAT(bad_json.out, Contains("bad.jsonl:2"));
  auto no_tasks = test::run_mtnlg("data decontaminate --input " + d + "/c/pile_cc.jsonl --tasks-dir " + d +
                                  "/missing --output " + d + "/x.jsonl");
  CHECK(no_tasks.exit_code == 2);
  CHECK_THAT(no_tasks.out, Contains("missing"));

  // Quality: train, corrupt the model, score fails with exit 2.
  REQUIRE(
      test::run_mtnlg("data synth-corpus --kind quality --docs 300 --output-dir " + d + "/q --no-progress").exit_code ==
      0);
  auto tr = test::run_mtnlg("data quality train --positive " + d + "/q/positive.jsonl --negative " + d +
                            "/q/negative.jsonl --model " + d + "/q.bin --bucket-bits 16 --no-progress");
  INFO(tr.out);
  REQUIRE(tr.exit_code == 0);
  CHECK_THAT(tr.out, Contains("precision"));
  auto sc = test::run_mtnlg("data quality score --input " + d + "/q/negative.jsonl --model " + d + "/q.bin --output " +
                            d + "/s.jsonl");
  CHECK(sc.exit_code == 0);
  std::string model = test::read_file(dir / "q.bin");
  model[64] = static_cast<char>(model[64] ^ 1);
  test::write_file(dir / "q-bad.bin", model);
  auto bad_model = test::run_mtnlg("data quality filter --input " + d + "/q/negative.jsonl --model " + d +
                                   "/q-bad.bin --output " + d + "/f.jsonl");
  CHECK(bad_model.exit_code == 2);
  CHECK_THAT(bad_model.out, Contains("q-bad.bin"));
}
