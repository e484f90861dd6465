// [e2e] `mtnlg data curate`: a small mixed corpus (a WARC source, two JSONL sources of
// the synthetic curation corpus, near-duplicates of web pages planted in another source,
// planted eval passages) through every stage; counts against the planted truth, the
// blend trains, 3 ranks under mpirun write the same bytes as one process, a kill -9
// mid-run resumes to the same bytes, a third run redoes nothing.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "test/support/data_util.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using test::read_jsonl;

// Every file of the work directory that must not depend on interruptions: data, token
// files, blend, recipe, report (the sub-commands' reports carry timings and are left out).
std::map<std::string, std::string> outputs(const fs::path& work) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(work)) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    if (n.find(".report.json") != std::string::npos || n == "dedup_report.json") continue;
    m[fs::relative(e.path(), work).string()] = test::read_file(e.path());
  }
  return m;
}

const json& stage(const json& funnel, const std::string& src, const std::string& name) {
  for (const auto& s : funnel.at(src))
    if (s["stage"] == name) return s;
  FAIL("no stage " << name << " for " << src);
  static json none;
  return none;
}

}  // namespace

TEST_CASE("mtnlg data curate: mixed corpus, planted truth, blend trains, kill -9 resumes byte-identical",
          "[e2e][curate]") {
  test::TempDir dir("curate");
  const fs::path d = dir.path();
  const std::string src = test::source_dir();
  auto gen = test::run_mtnlg("data synth-corpus --output-dir " + (d / "c").string() +
                             " --docs 300 --sources 2 --contaminate 6 --no-progress");
  REQUIRE(gen.exit_code == 0);
  auto genq = test::run_mtnlg("data synth-corpus --kind quality --output-dir " + (d / "q").string() +
                              " --docs 400 --no-progress");
  REQUIRE(genq.exit_code == 0);
  auto train_q = test::run_mtnlg("data quality train --positive " + (d / "q/positive.jsonl").string() + " --negative " +
                                 (d / "q/negative.jsonl").string() + " --model " + (d / "quality.bin").string() +
                                 " --no-progress");
  REQUIRE(train_q.exit_code == 0);
  const auto vocab = test::run_command(src + "/scripts/fetch-gpt2-vocab.sh");
  if (vocab.exit_code != 0) {
    WARN("GPT-2 vocabulary not available: data curate e2e skipped");
    return;
  }
  std::string gpt2 = vocab.out;
  while (!gpt2.empty() && gpt2.back() == '\n') gpt2.pop_back();
  gpt2 = gpt2.substr(gpt2.rfind('\n') + 1);

  // Plant: the known text of 4 web pages, also in the books source (books wins by priority).
  {
    std::ofstream books(d / "books.jsonl");
    books << test::read_file(d / "c/books3.jsonl");
    int n = 0;
    for (const auto& t : read_jsonl(src + "/test/fixtures/warc/pages_truth.jsonl")) {
      if (t["language"] != "en" || n == 4) continue;
      books << json{{"text", t["text"]}}.dump() << "\n";
      ++n;
    }
  }
  test::write_file(d / "base.yaml",
                   "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 32, "
                   "max_position_embeddings: 32}\n"
                   "training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 3}\n"
                   "optimizer: {lr: 1.0e-3, min_lr: 1.0e-4}\n"
                   "data: {split: \"98,2,0\"}\n"
                   "logging: {tensorboard: false}\n");
  const std::string pipeline =
      "work_dir: work\n"
      "sources:\n"
      "  - name: web\n"
      "    warc: [" +
      src + "/test/fixtures/warc/pages.warc.gz, " + src +
      "/test/fixtures/warc/charsets.warc]\n"
      "    extract: {languages: [en]}\n"
      "    quality: {model: quality.bin, mode: threshold, threshold: 0.2}\n"
      "    weight: 2\n"
      "  - name: pile_cc\n"
      "    jsonl: [c/pile_cc.jsonl]\n"
      "    weight: 1\n"
      "  - name: books\n"
      "    jsonl: books.jsonl\n"
      "    weight: 1\n"
      "dedup: {threshold: 0.8, priority: [books, pile_cc, web]}\n"
      "decontaminate: {tasks_dir: c/tasks}\n"
      "tokenizer: {vocab_file: " +
      gpt2 + "/vocab.json, merge_file: " + gpt2 +
      "/merges.txt}\n"
      "blend: {recipe: base.yaml}\n";
  test::write_file(d / "pipe.yaml", pipeline);
  fs::copy(d / "pipe.yaml", d / "pipe2.yaml");

  auto run = test::run_mtnlg("data curate --no-progress " + (d / "pipe.yaml").string());
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  const fs::path W = d / "work";
  const json rep = json::parse(test::read_file(W / "curate_report.json"));
  const json& f = rep["funnel"];
  // Extract: 36 pages + 6 charset pages; the 4 non-English pages and the Shift-JIS pair dropped.
  CHECK(stage(f, "web", "extract")["documents_in"] == 42);
  CHECK(stage(f, "web", "extract")["documents_out"] == 36);
  // Quality: the same count as the standalone command on the same input.
  auto qf = test::run_mtnlg("data quality filter --input " + (W / "1-source/web.jsonl").string() + " --model " +
                            (d / "quality.bin").string() + " --output " + (d / "q.jsonl").string() +
                            " --mode threshold --threshold 0.2");
  REQUIRE(qf.exit_code == 0);
  const auto web_q = static_cast<int64_t>(read_jsonl(d / "q.jsonl").size());
  CHECK(stage(f, "web", "quality")["documents_out"] == web_q);
  // Dedup: the 4 planted copies leave the web source (books has priority), and the
  // synthetic sources lose their planted near-duplicates (truth_dedup.jsonl).
  int64_t planted_web_copies_kept_by_quality = 0;
  {
    int n = 0;
    for (const auto& t : read_jsonl(src + "/test/fixtures/warc/pages_truth.jsonl")) {
      if (t["language"] != "en" || n == 4) continue;
      ++n;
      for (const auto& doc : read_jsonl(W / "2-quality/web.jsonl"))
        if (doc["url"] == t["url"]) ++planted_web_copies_kept_by_quality;
    }
  }
  CHECK(stage(f, "web", "dedup")["documents_out"].get<int64_t>() ==
        stage(f, "web", "dedup")["documents_in"].get<int64_t>() - planted_web_copies_kept_by_quality);
  int64_t planted_dups = 0;
  for (const auto& t : read_jsonl(d / "c/truth_dedup.jsonl"))
    if (t["kind"] != "original" && t["kind"] != "partial") ++planted_dups;
  const int64_t removed_synth = stage(f, "pile_cc", "dedup")["documents_in"].get<int64_t>() -
                                stage(f, "pile_cc", "dedup")["documents_out"].get<int64_t>() +
                                stage(f, "books", "dedup")["documents_in"].get<int64_t>() -
                                stage(f, "books", "dedup")["documents_out"].get<int64_t>();
  CHECK(removed_synth >= planted_dups * 95 / 100);
  CHECK(removed_synth <= planted_dups);
  // Decontamination: exactly the planted passages that survived dedup.
  int64_t planted_left = 0;
  for (const auto& t : read_jsonl(d / "c/truth_contamination.jsonl")) {
    const std::string file =
        (W / "3-dedup" / (t["source"].get<std::string>() == "books3" ? "books.jsonl" : "pile_cc.jsonl")).string();
    const std::string passage = json(t["passage"].get<std::string>()).dump();
    if (test::read_file(file).find(passage.substr(1, passage.size() - 2)) != std::string::npos) ++planted_left;
  }
  int64_t decontam_removed = 0;
  for (const char* s : {"web", "pile_cc", "books"})
    decontam_removed += stage(f, s, "decontaminate")["documents_in"].get<int64_t>() -
                        stage(f, s, "decontaminate")["documents_out"].get<int64_t>();
  CHECK(planted_left > 0);
  CHECK(decontam_removed == planted_left);
  // Blend and recipe written; tokens per source; training runs on it.
  REQUIRE(rep["blend"].size() == 3);
  CHECK(rep["blend"][0]["weight"].get<double>() == Approx(0.5));
  for (const auto& b : rep["blend"]) CHECK(b["tokens"].get<int64_t>() > 0);
  CHECK_THAT(test::read_file(W / "blend.yaml"), Contains("5-tokens/web_text_document"));
  CHECK_THAT(test::read_file(W / "curate_report.md"), Contains("| web | extract | 42 | 36 |"));
  auto tr = test::run_train((W / "train.yaml").string(), (d / "run").string(), "");
  INFO(tr.out);
  CHECK(tr.exit_code == 0);
  CHECK(test::read_losses(d / "run").size() == 3);
  // The report page of the work_dir: the funnel per source and stage, and the blend.
  auto page = test::run_mtnlg("report " + W.string() + " --output " + (d / "funnel.html").string());
  INFO(page.out);
  REQUIRE(page.exit_code == 0);
  const std::string html = test::read_file(d / "funnel.html");
  CHECK_THAT(html, Contains("<h2>Corpus funnel</h2>"));
  CHECK_THAT(html, Contains("<tr><td>web</td><td>extract</td><td class=\"num\">42</td><td class=\"num\">36</td>"));
  for (const auto& [src, stages] : rep["funnel"].items())
    for (const auto& e : stages)
      CHECK_THAT(html, Contains("<tr><td>" + src + "</td><td>" + e["stage"].get<std::string>() + "</td>"));
  CHECK_THAT(html, Contains("<h2>Blend</h2>"));
  for (const auto& b : rep["blend"]) {  // the tokenize row carries the exact token count of the blend
    const std::string src = b["source"].get<std::string>();
    CHECK(rep["funnel"][src].back()["stage"] == "tokenize");
    CHECK(rep["funnel"][src].back()["tokens_out"] == b["tokens"]);
  }

  const auto want = outputs(W);
  // 3 ranks (dedup across them, the other stages on rank 0): the same bytes.
  fs::remove_all(d / "work");
  auto ranks3 = test::run_command("sh " + src + "/test/support/mpi/mpirun.sh 3 " + std::string(MTNLG_BINARY) +
                                  " data curate --no-progress " + (d / "pipe.yaml").string());
  INFO(ranks3.out);
  REQUIRE(ranks3.exit_code == 0);
  CHECK(outputs(W) == want);

  // A kill -9 right after dedup wrote its files (before its manifest), then a re-run.
  fs::remove_all(d / "work");
  auto killed = test::run_command("MTNLG_TEST_CURATE_KILL=dedup " + std::string(MTNLG_BINARY) +
                                  " data curate --no-progress " + (d / "pipe.yaml").string());
  CHECK(killed.exit_code != 0);
  CHECK_FALSE(fs::exists(W / "blend.yaml"));
  // What writes cut short by a kill leave behind (the writer's pid is in the name; no
  // process has pid 999999999): the re-run removes it. A temporary file of a writer
  // still running (this test's pid) and a file that only looks similar stay.
  const std::string dead = "999999999", alive = std::to_string(::getpid());
  const std::vector<fs::path> stale = {W / ("blend.yaml.tmp." + dead + ".0"),
                                       W / "1-source" / ("web.manifest.json.tmp." + dead + ".3"),
                                       W / "3-dedup" / ("web.jsonl.tmp." + dead + ".dedup"),
                                       W / "3-dedup" / (".dedup-spill-rank0-" + dead) / "band-0.bin",
                                       W / "1-source" / "web.shards" / ("web.jsonl.tmp." + dead + ".7")};
  for (const auto& f : stale) {
    fs::create_directories(f.parent_path());
    test::write_file(f, "partial");
  }
  const fs::path live = W / ("curate_report.md.tmp." + alive + ".0"), similar = W / "notes.tmp.txt";
  test::write_file(live, "being written");
  test::write_file(similar, "mine");
  auto resumed = test::run_mtnlg("data curate --no-progress " + (d / "pipe.yaml").string());
  INFO(resumed.out);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.out, Contains("source/web: up to date") && Contains("dedup: running") &&
                              Contains("left by an interrupted run"));
  for (const auto& f : stale) CHECK_FALSE(fs::exists(f));
  CHECK_FALSE(fs::exists(W / "3-dedup" / (".dedup-spill-rank0-" + dead)));
  CHECK(fs::exists(live));
  CHECK(fs::exists(similar));
  fs::remove(live);
  fs::remove(similar);
  CHECK_FALSE(fs::exists(W / "1-source" / "web.shards"));  // emptied, so removed too
  CHECK(outputs(W) == want);
  // Nothing to redo; a changed parameter redoes its stage and those after it only.
  auto again = test::run_mtnlg("data curate --no-progress " + (d / "pipe.yaml").string());
  CHECK_THAT(again.out, Contains("0 stages run, 11 up to date"));
  std::string p2 = pipeline;
  p2.replace(p2.find("{tasks_dir: c/tasks}"), 20, "{tasks_dir: c/tasks, ngram: 12}");
  test::write_file(d / "pipe.yaml", p2);
  auto changed = test::run_mtnlg("data curate --no-progress " + (d / "pipe.yaml").string());
  CHECK_THAT(changed.out, Contains("dedup: up to date") && Contains("decontaminate/web: running"));

  // Bad recipes: one line naming the field.
  test::write_file(
      d / "bad.yaml",
      "work_dir: w\nsources:\n  - name: a\n    jsonl: [nope.jsonl]\ntokenizer: {vocab_file: v, merge_file: m}\n");
  auto bad = test::run_mtnlg("data curate " + (d / "bad.yaml").string());
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out, Contains("sources[0]: input") && Contains("nope.jsonl: no such file"));
  test::write_file(d / "bad2.yaml",
                   "work_dir: w\nsources:\n  - name: a\n    jsonl: [books.jsonl]\n    qualty: {}\n"
                   "tokenizer: {vocab_file: v, merge_file: m}\n");
  auto bad2 = test::run_mtnlg("data curate " + (d / "bad2.yaml").string());
  CHECK(bad2.exit_code == 2);
  CHECK_THAT(bad2.out, Contains("sources[0].qualty: unknown key"));
}

// A pipeline file's mistakes: one line naming the file and the field, exit 2, before any
// stage runs.
TEST_CASE("mtnlg data curate: a bad pipeline file is one line naming the field", "[curate]") {
  test::TempDir dir("curate-bad");
  const fs::path in = dir.path() / "a.jsonl";
  std::ofstream(in) << "{\"text\": \"hello\"}\n";
  const std::string tok = "tokenizer: {vocab_file: " + test::source_dir() +
                          "/third_party/gpt2/vocab.json, merge_file: " + test::source_dir() +
                          "/third_party/gpt2/merges.txt}\n";
  const std::string src = "  - {name: web, jsonl: " + in.string() + "}\n";
  struct Case {
    const char* what;
    std::string yaml, expect;
  } cases[] = {
      {"unknown key", "work_dir: w\nsources:\n" + src + "dedupe: {}\n" + tok, "dedupe: unknown key"},
      {"name twice", "work_dir: w\nsources:\n" + src + src + tok, "sources[1].name"},
      {"priority not a source", "work_dir: w\nsources:\n" + src + "dedup: {priority: [books]}\n" + tok,
       "dedup.priority"},
      {"no input", "work_dir: w\nsources:\n  - {name: web}\n" + tok, "exactly one of warc: or jsonl:"},
      {"bad weight", "work_dir: w\nsources:\n  - {name: web, jsonl: " + in.string() + ", weight: 0}\n" + tok,
       "sources[0].weight"},
      {"no tokenizer", "work_dir: w\nsources:\n" + src, "tokenizer"},
  };
  for (const auto& c : cases) {
    INFO(c.what << "\n" << c.yaml);
    const fs::path file = dir.path() / "pipeline.yaml";
    std::ofstream(file) << c.yaml;
    const auto r = test::run_mtnlg("data curate " + file.string() + " 2>&1");
    INFO(r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Contains(c.expect) && Contains("pipeline.yaml"));
    CHECK(!fs::exists(dir.path() / "w"));
  }
}
