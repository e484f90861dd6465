// The curation pipeline engine (data/curation/pipeline.hpp) in-process, one rank: a JSONL
// source through the stages to a blend; a second run finds every stage up to date; a bad
// pipeline file is an InputError naming the file and field; interrupted writes' temporary
// files are removed unless their writer still runs. (The `mtnlg data curate` command with
// WARC sources, kills and mpirun: test/app/data/test_data_curate.cpp.)
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "data/curation/pipeline.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
std::string tokenizer() {
  return "tokenizer: {vocab_file: " + test::source_dir() +
         "/third_party/gpt2/vocab.json, merge_file: " + test::source_dir() + "/third_party/gpt2/merges.txt}\n";
}
}  // namespace

TEST_CASE("curation pipeline: one rank, a JSONL source to a blend, then up to date", "[curate]") {
  if (!fs::exists(test::source_dir() + "/third_party/gpt2/vocab.json"))
    FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir dir("pipeline-lib");
  const fs::path in = dir.path() / "web.jsonl";
  {
    std::ofstream o(in);
    for (int i = 0; i < 40; ++i)
      o << "{\"text\": \"Document " << i << " tells of the river that runs past the mill and the town beside it.\"}\n";
  }
  const fs::path file = dir.path() / "pipeline.yaml";
  std::ofstream(file) << "work_dir: w\nsources:\n  - {name: web, jsonl: " << in.string() << "}\n" << tokenizer();
  curation::SoloRankComm solo;
  curation::run_pipeline(solo, file.string(), false);
  const fs::path W = dir.path() / "w";
  CHECK(fs::exists(W / "blend.yaml"));
  CHECK(fs::exists(W / "5-tokens" / "web_text_document.bin"));
  CHECK(fs::exists(W / "curate_report.json"));
  const auto blend = fs::last_write_time(W / "blend.yaml");
  curation::run_pipeline(solo, file.string(), false);  // every manifest matches: nothing redone
  CHECK(fs::last_write_time(W / "5-tokens" / "web_text_document.bin") <= blend);

  std::ofstream(file) << "work_dir: w\nsources:\n  - {name: web}\n" << tokenizer();
  try {
    curation::run_pipeline(solo, file.string(), false);
    FAIL("a source without input was accepted");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Contains("pipeline.yaml") && Contains("exactly one of warc: or jsonl:"));
  }
}

TEST_CASE("curation pipeline: interrupted writes' temporaries go, a running writer's stay", "[curate]") {
  test::TempDir dir("pipeline-tmp");
  const fs::path W = dir.path();
  fs::create_directories(W / "3-dedup");
  const long dead = 999999999, alive = static_cast<long>(::getpid());
  std::ofstream(W / ("blend.yaml.tmp." + std::to_string(dead) + ".1")) << "x";
  std::ofstream(W / "3-dedup" / ("web.jsonl.tmp." + std::to_string(dead) + ".dedup")) << "x";
  fs::create_directories(W / "3-dedup" / (".dedup-spill-rank0-" + std::to_string(dead)));
  std::ofstream(W / ("train.yaml.tmp." + std::to_string(alive) + ".2")) << "x";  // this process: running
  std::ofstream(W / "blend.yaml") << "kept";
  CHECK(curation::remove_stale_temporaries(W) == 3);
  CHECK(fs::exists(W / ("train.yaml.tmp." + std::to_string(alive) + ".2")));
  CHECK(fs::exists(W / "blend.yaml"));
  CHECK_FALSE(fs::exists(W / ("blend.yaml.tmp." + std::to_string(dead) + ".1")));
  CHECK_FALSE(fs::exists(W / "3-dedup" / (".dedup-spill-rank0-" + std::to_string(dead))));
}
