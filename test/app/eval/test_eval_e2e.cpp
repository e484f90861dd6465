// `mtnlg eval` / `mtnlg generate` through the binary: results and sample files, bad
// input (unknown task, missing split, malformed row, bad options) with exit 2 and a
// one-line message, left truncation of long contexts, a blank answer field.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string fixtures() { return test::source_dir() + "/test/fixtures/eval"; }
std::string model_args() {
  return "--random-init " + fixtures() + "/tiny-model.yaml --vocab-file " + test::source_dir() +
         "/third_party/gpt2/vocab.json --merge-file " + test::source_dir() + "/third_party/gpt2/merges.txt";
}
// One OpenMP thread: the tiny model gains nothing from more, and the test machine is shared.
test::RunResult mtnlg_run(const std::string& args) {
  return test::run_command("OMP_NUM_THREADS=1 '" + std::string(MTNLG_BINARY) + "' " + args + " 2>&1");
}
bool have_vocab() { return fs::exists(test::source_dir() + "/third_party/gpt2/vocab.json"); }

}  // namespace

TEST_CASE("mtnlg eval: all tasks write results.json and samples.jsonl", "[e2e]") {
  if (!have_vocab()) FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("eval-e2e");
  auto r = mtnlg_run("eval " + model_args() + " --tasks all --data-dir " + fixtures() +
                     " --num-fewshot 1 --task-fewshot piqa=2 --bootstrap-iters 1000 --no-progress --output " +
                     (d / "r.json").string() + " --log-samples " + (d / "s.jsonl").string());
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("|Task") && Contains("acc_norm") && Contains("±"));
  auto j = nlohmann::json::parse(test::read_file(d / "r.json"));
  CHECK(j["results"].size() == 9);
  CHECK(j["results"]["lambada_openai"].contains("ppl_stderr"));
  CHECK(j["results"]["hellaswag"].contains("acc_norm_stderr"));
  CHECK(j["results"]["hans"].contains("acc_lexical_overlap"));
  CHECK(j["versions"]["boolq"] == 1);
  CHECK(j["config"]["num_fewshot"] == 1);
  CHECK(j["n-shot"]["piqa"] == 2);
  CHECK(j["n-samples"]["race_high"]["original"] == 2);
  // samples: one line per doc with the interface's fields
  std::string s = test::read_file(d / "s.jsonl");
  int64_t lines = std::count(s.begin(), s.end(), '\n');
  CHECK(lines == 5 + 4 + 2 + 4 + 3 + 3 + 3 + 4 + 3);
  auto first = nlohmann::json::parse(s.substr(0, s.find('\n')));
  for (const char* k : {"task", "doc_id", "contexts", "continuations", "loglikelihoods", "is_greedy", "gold", "acc"})
    CHECK(first.contains(k));
  // same command, same numbers (determinism)
  auto r2 = mtnlg_run("eval " + model_args() + " --tasks all --data-dir " + fixtures() +
                      " --num-fewshot 1 --task-fewshot piqa=2 --bootstrap-iters 1000 --no-progress --output " +
                      (d / "r2.json").string());
  REQUIRE(r2.exit_code == 0);
  CHECK(nlohmann::json::parse(test::read_file(d / "r2.json"))["results"] == j["results"]);
}

TEST_CASE("mtnlg eval: v0.4 results name the reference release and its task versions", "[e2e]") {
  if (!have_vocab()) FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("eval-v04");
  auto r = mtnlg_run("eval " + model_args() + " --tasks boolq,race_high,piqa --harness-version 0.4 --data-dir " +
                     fixtures() + " --num-fewshot 1 --no-progress --output " + (d / "r.json").string());
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(test::read_file(d / "r.json"));
  CHECK(j["config"]["harness_version"] == "0.4");
  CHECK(j["config"]["harness_reference"] == "v0.4.9.1");
  CHECK(j["versions"]["boolq"] == 2.0);
  CHECK(j["versions"]["race_high"] == 2.0);
  CHECK(j["versions"]["piqa"] == 1.0);
}

TEST_CASE("mtnlg eval: bad input exits 2 with one line naming the problem", "[e2e]") {
  if (!have_vocab()) FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("eval-bad");
  auto r = mtnlg_run("eval " + model_args() + " --tasks piqa,lambada --data-dir " + fixtures());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("unknown task 'lambada'") && Contains("lambada_openai") && Contains("winogrande"));

  fs::create_directories(d / "piqa");
  r = mtnlg_run("eval " + model_args() + " --tasks piqa --data-dir " + d.str());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("piqa/validation.jsonl: split file missing"));

  test::write_file(
      d / "piqa/validation.jsonl",
      "{\"goal\": \"a\", \"sol1\": \"b\", \"sol2\": \"c\", \"label\": 0}\n\n{\"goal\": \"a\", \"sol1\": \"b\"}\n");
  r = mtnlg_run("eval " + model_args() + " --tasks piqa --data-dir " + d.str());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("piqa/validation.jsonl:3: field 'sol2' missing"));

  // few-shot needs the train split
  test::write_file(d / "piqa/validation.jsonl", "{\"goal\": \"a\", \"sol1\": \"b\", \"sol2\": \"c\", \"label\": 0}\n");
  r = mtnlg_run("eval " + model_args() + " --tasks piqa --num-fewshot 2 --data-dir " + d.str());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("piqa/train.jsonl: split file missing"));

  r = mtnlg_run("eval " + model_args() + " --tasks piqa --harness-version 0.5 --data-dir " + d.str());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("valid values are 0.3, 0.4"));
  r = mtnlg_run("eval --tasks piqa --data-dir " + d.str());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("--checkpoint DIR or --random-init RECIPE"));
}

TEST_CASE("mtnlg eval: long contexts are left-truncated, blank answers are scored as ' '", "[e2e]") {
  if (!have_vocab()) FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("eval-trunc");
  fs::create_directories(d / "piqa");
  std::string goal;
  for (int i = 0; i < 200; ++i) goal += "word" + std::to_string(i) + " ";
  test::write_file(d / "piqa/validation.jsonl",
                   "{\"goal\": \"" + goal + "\", \"sol1\": \"\", \"sol2\": \"go\", \"label\": 1}\n");
  auto r = mtnlg_run("eval " + model_args() + " --tasks piqa --data-dir " + d.str() + " --no-progress --log-samples " +
                     (d / "s.jsonl").string());
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  auto s = nlohmann::json::parse(test::read_file(d / "s.jsonl"));
  CHECK(s["continuations"][0] == " ");
  CHECK(s["truncated_tokens"][0].get<int64_t>() > 0);  // 128-token window of the tiny recipe
  CHECK(s["loglikelihoods"][0].is_number());
}

TEST_CASE("mtnlg generate: seeded, greedy, prompt file", "[e2e]") {
  if (!have_vocab()) FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("gen");
  auto a = mtnlg_run("generate " + model_args() + " --prompt 'Q: 12 # 3 = 4' --max-new-tokens 8 --seed 5 --no-echo");
  auto b = mtnlg_run("generate " + model_args() + " --prompt 'Q: 12 # 3 = 4' --max-new-tokens 8 --seed 5 --no-echo");
  INFO(a.out);
  REQUIRE(a.exit_code == 0);
  CHECK(a.out == b.out);
  CHECK(!a.out.empty());
  test::write_file(d / "p.txt", "Q: 12 # 3 = 4\nQ: 8 # 2 =");
  auto g = mtnlg_run("generate " + model_args() + " --prompt-file " + (d / "p.txt").string() +
                     " --greedy --max-new-tokens 4");
  REQUIRE(g.exit_code == 0);
  CHECK_THAT(g.out, Contains("Q: 8 # 2 ="));
  auto bad = mtnlg_run("generate " + model_args() + " --prompt x --top-p 0");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out, Contains("--top-p must be in (0, 1]"));
}
