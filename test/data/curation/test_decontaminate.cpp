// Decontamination against planted eval passages: every planted document found,
// nothing else removed (clean control), cut mode, the too-common rule, bad input.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "data/curation/decontaminate.hpp"
#include "data/curation/synth_corpus.hpp"
#include "data/curation/text.hpp"
#include "test/support/data_util.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::curation;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

json make_corpus(const std::filesystem::path& dir, int64_t contaminate) {
  SynthOptions s;
  s.output_dir = dir.string();
  s.docs = 1500;
  s.sources = 1;
  s.contaminate = contaminate;
  s.seed = 21;
  s.progress = false;
  return make_synthetic_corpus(s);
}

}  // namespace

TEST_CASE("decontamination removes exactly the documents with planted passages", "[curation]") {
  test::TempDir dir("decontam");
  auto summary = make_corpus(dir.path(), 45);
  std::string src = summary["sources"][0];
  std::set<int64_t> planted;
  std::map<std::string, int64_t> per_task;
  for (auto& l : test::lines_of(dir / "truth_contamination.jsonl")) {
    json t = json::parse(l);
    planted.insert(t["line"].get<int64_t>());
    ++per_task[t["task"]];
  }
  REQUIRE(planted.size() == 45);
  CHECK(per_task.size() == 9);  // every task planted (round robin)

  DecontamOptions o;
  o.input = (dir / (src + ".jsonl")).string();
  o.tasks_dir = (dir / "tasks").string();
  o.output = (dir / "clean.jsonl").string();
  o.progress = false;
  DecontamResult r = run_decontaminate(o);
  CHECK(r.removed == 45);
  CHECK(r.documents == 1500);
  json rep = json::parse(test::read_file(dir / "clean.jsonl.report.json"));
  std::set<int64_t> removed;
  for (auto& d : rep["documents_log"]) removed.insert(d["line"].get<int64_t>());
  CHECK(removed == planted);
  for (auto& [task, n] : per_task) {
    INFO(task);
    CHECK(rep["tasks"][task]["docs_hit"] == n);
    CHECK(rep["tasks"][task]["ngrams_matched"].get<int64_t>() >= n);
  }
  // Kept lines are the input's other lines, byte-identical and in order.
  auto in = test::lines_of(o.input), out = test::lines_of(o.output);
  std::vector<std::string> expect;
  for (size_t i = 0; i < in.size(); ++i)
    if (!planted.count(static_cast<int64_t>(i) + 1)) expect.push_back(in[i]);
  CHECK(out == expect);

  SECTION("cut mode keeps the text away from the matches") {
    o.mode = "cut";
    o.output = (dir / "cut.jsonl").string();
    o.min_fragment = 50;
    DecontamResult c = run_decontaminate(o);
    CHECK(c.cut + c.removed == 45);
    CHECK(c.cut > 30);
    // No output line carries a planted passage's 13-gram any more.
    DecontamOptions again = o;
    again.mode = "remove";
    again.input = o.output;
    again.output = (dir / "cut-check.jsonl").string();
    CHECK(run_decontaminate(again).removed == 0);
    json crep = json::parse(test::read_file(dir / "cut.jsonl.report.json"));
    CHECK(crep["fragments_written"].get<int64_t>() > 30);
  }
}

TEST_CASE("decontamination: clean control removes nothing", "[curation]") {
  test::TempDir dir("decontam-clean");
  auto summary = make_corpus(dir.path(), 0);
  DecontamOptions o;
  o.input = (dir / (summary["sources"][0].get<std::string>() + ".jsonl")).string();
  o.tasks_dir = (dir / "tasks").string();
  o.output = (dir / "clean.jsonl").string();
  o.progress = false;
  DecontamResult r = run_decontaminate(o);
  CHECK(r.removed == 0);
  CHECK(test::read_file(o.output) == test::read_file(o.input));
  json rep = json::parse(test::read_file(dir / "clean.jsonl.report.json"));
  CHECK(rep["tasks"].size() == 9);
  CHECK(rep["tasks"]["piqa"]["rows"] == 20);
}

TEST_CASE("decontamination: cut mode geometry, fragments, too-common n-grams", "[curation]") {
  test::TempDir dir("decontam-cut");
  std::string passage = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron";
  test::write_file(dir / "tasks" / "piqa" / "validation.jsonl", json{{"goal", passage}, {"label", 0}}.dump() + "\n");
  std::string left(400, 'L'), right(300, 'R');
  for (size_t i = 50; i < left.size(); i += 50) left[i] = ' ';
  for (size_t i = 50; i < right.size(); i += 50) right[i] = ' ';
  std::string doc = left + " Alpha beta, GAMMA delta epsilon zeta eta theta iota kappa lambda mu nu! " + right;
  std::string train =
      json{{"text", doc}, {"meta", 1}}.dump() + "\n" + json{{"text", "unrelated words here"}}.dump() + "\n";
  test::write_file(dir / "train.jsonl", train);
  DecontamOptions o;
  o.input = (dir / "train.jsonl").string();
  o.tasks_dir = (dir / "tasks").string();
  o.output = (dir / "out.jsonl").string();
  o.mode = "cut";
  o.cut_margin = 100;
  o.min_fragment = 150;
  o.progress = false;
  DecontamResult r = run_decontaminate(o);
  CHECK(r.cut == 1);
  auto out = test::lines_of(o.output);
  REQUIRE(out.size() == 3);  // two fragments + the unrelated line
  json f1 = json::parse(out[0]), f2 = json::parse(out[1]);
  CHECK(f1["meta"] == 1);  // other fields kept
  CHECK(f1["text"].get<std::string>() == left.substr(0, left.size() - 99));
  CHECK(f2["text"].get<std::string>() == right.substr(99));
  CHECK(out[2] == json{{"text", "unrelated words here"}}.dump());

  // Fragments below the minimum are dropped; more than --max-fragments pieces drop all.
  o.min_fragment = 350;
  o.output = (dir / "out2.jsonl").string();
  run_decontaminate(o);
  CHECK(test::lines_of(o.output).size() == 1);

  // The same passage in 12 documents: ignored as too common (> --max-hits 10), unless 0.
  std::string many;
  for (int i = 0; i < 12; ++i) many += json{{"text", "x " + passage + " y"}}.dump() + "\n";
  test::write_file(dir / "many.jsonl", many);
  o.input = (dir / "many.jsonl").string();
  o.output = (dir / "many-out.jsonl").string();
  o.mode = "remove";
  CHECK(run_decontaminate(o).removed == 0);
  o.max_hits = 0;
  CHECK(run_decontaminate(o).removed == 12);
}

TEST_CASE("decontamination: bad input", "[curation]") {
  test::TempDir dir("decontam-bad");
  test::write_file(dir / "train.jsonl", "{\"text\": \"a b c\"}\n");
  DecontamOptions o;
  o.input = (dir / "train.jsonl").string();
  o.tasks_dir = (dir / "nope").string();
  o.output = (dir / "out.jsonl").string();
  o.progress = false;
  CHECK_THROWS_WITH(run_decontaminate(o), Contains("nope") && Contains("no such directory"));
  std::filesystem::create_directories(dir / "empty");
  o.tasks_dir = (dir / "empty").string();
  CHECK_THROWS_WITH(run_decontaminate(o), Contains("no <task>/<split>.jsonl"));
  test::write_file(dir / "tasks" / "boolq" / "validation.jsonl", "{\"passage\": \"x\"}\n{bad\n");
  o.tasks_dir = (dir / "tasks").string();
  CHECK_THROWS_WITH(run_decontaminate(o), Contains("validation.jsonl:2"));
  test::write_file(dir / "tasks" / "boolq" / "validation.jsonl", "{\"passage\": \"x\"}\n");
  o.mode = "snip";
  CHECK_THROWS_WITH(run_decontaminate(o), Contains("remove or cut"));
}
