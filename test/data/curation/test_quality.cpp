// Quality classifier on synthetic curated (English grammar) vs raw (word salad,
// boilerplate) text: held-out accuracy, scoring, filtering, reproducibility.
#include <catch2/catch.hpp>

#include <sstream>

#include "core/error.hpp"
#include "data/curation/quality.hpp"
#include "data/curation/synth_corpus.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::curation;
using Catch::Matchers::Contains;
using nlohmann::json;

TEST_CASE("quality classifier separates curated from raw text", "[curation]") {
  test::TempDir dir("quality");
  SynthOptions s;
  s.output_dir = dir.str();
  s.kind = "quality";
  s.docs = 1500;
  s.seed = 4;
  s.progress = false;
  make_synthetic_corpus(s);

  QualityTrainOptions t;
  t.positive = (dir / "positive.jsonl").string();
  t.negative = (dir / "negative.jsonl").string();
  t.model = (dir / "q.bin").string();
  t.bucket_bits = 18;
  t.holdout = 0.2;
  t.progress = false;
  json rep = train_quality(t);
  const json& held = rep["held_out_metrics"];
  INFO(held.dump());
  CHECK(held["documents"].get<int64_t>() > 400);
  CHECK(held["accuracy"].get<double>() >= 0.97);
  CHECK(held["precision"].get<double>() >= 0.95);
  CHECK(held["recall"].get<double>() >= 0.95);
  CHECK(json::parse(test::read_file(dir / "q.bin.report.json"))["held_out_metrics"] == held);

  // Same seed, same model bytes.
  t.model = (dir / "q2.bin").string();
  train_quality(t);
  CHECK(test::read_file(dir / "q.bin") == test::read_file(dir / "q2.bin"));

  QualityModel m = QualityModel::load((dir / "q.bin").string());
  CHECK(m.score("The old teacher repaired the bridge near the village. A child quietly watched the small garden. "
                "Before the storm, the careful farmer left the market.") > 0.5);
  CHECK(m.score("click here buy now cheap menu | login cart free download cookie") < 0.5);

  // Scores: one line per document.
  json sr = score_quality(t.positive, t.model, (dir / "scores.jsonl").string(), "text");
  CHECK(sr["documents"] == 1500);
  std::istringstream in(test::read_file(dir / "scores.jsonl"));
  std::string first;
  std::getline(in, first);
  CHECK(json::parse(first)["line"] == 1);

  // Threshold filter keeps most positives and few negatives; Pareto keeps a seeded subset.
  QualityFilterOptions f;
  f.model = t.model;
  f.input = t.negative;
  f.output = (dir / "neg-kept.jsonl").string();
  json fr = filter_quality(f);
  CHECK(fr["kept"].get<int64_t>() < 100);
  f.input = t.positive;
  f.output = (dir / "pos-kept.jsonl").string();
  CHECK(filter_quality(f)["kept"].get<int64_t>() > 1400);
  f.mode = "pareto";
  f.output = (dir / "pos-pareto.jsonl").string();
  json p1 = filter_quality(f);
  f.output = (dir / "pos-pareto2.jsonl").string();
  json p2 = filter_quality(f);
  CHECK(p1["kept"] == p2["kept"]);
  CHECK(test::read_file(dir / "pos-pareto.jsonl") == test::read_file(dir / "pos-pareto2.jsonl"));
  CHECK(p1["kept"].get<int64_t>() > 300);  // scores near 1 keep with probability ~1
  f.mode = "median";
  CHECK_THROWS_WITH(filter_quality(f), Contains("threshold or pareto"));
}

TEST_CASE("quality train: bad input", "[curation]") {
  test::TempDir dir("quality-bad");
  test::write_file(dir / "p.jsonl", "{\"text\": \"good text\"}\n");
  test::write_file(dir / "n.jsonl", "\n");
  QualityTrainOptions t;
  t.positive = (dir / "p.jsonl").string();
  t.negative = (dir / "n.jsonl").string();
  t.model = (dir / "m.bin").string();
  t.progress = false;
  CHECK_THROWS_WITH(train_quality(t), Contains("both"));
  t.negative = (dir / "none.jsonl").string();
  CHECK_THROWS_WITH(train_quality(t), Contains("none.jsonl"));
}
