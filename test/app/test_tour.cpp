// The README's "A tour" section, run for real: every line of it that starts with "$ "
// is a command; they run in order in a temporary directory laid out like the repository
// (build/mtnlg -> the binary under test, recipes/ test/ third_party/ -> the sources,
// demo-data/ made by scripts/make-demo-corpus.sh), with one rewrite: 2 training
// iterations instead of 20. Each must exit 0 and print the phrase the README shows.
#include <catch2/catch.hpp>

#include <filesystem>
#include <iterator>
#include <sstream>

#include "test/support/demo_tree.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg::test;
namespace fs = std::filesystem;

namespace {

// The "$ " command lines of README.md's "## A tour" section, and the section's text.
std::vector<std::string> tour_commands(std::string* section) {
  const std::string readme = read_file(source_dir() + "/README.md");
  const auto begin = readme.find("\n## A tour\n");
  REQUIRE(begin != std::string::npos);
  const auto end = readme.find("\n## ", begin + 1);
  *section = readme.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  std::vector<std::string> cmds;
  std::istringstream in(*section);
  std::string line;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, 2, "$ ") == 0) cmds.push_back(line.substr(first + 2));
  }
  return cmds;
}

}  // namespace

TEST_CASE("README tour: train, eval, plan and report run as shown", "[e2e]") {
  std::string section;
  const auto cmds = tour_commands(&section);
  // Per step: how its command starts, and a line (part) of output the README shows.
  struct Step {
    std::string prefix, phrase;
  } steps[] = {
      {"build/mtnlg train recipes/cpu-demo.yaml", "committed: runs/cpu-demo/checkpoints/iter_00000"},
      {"build/mtnlg eval --checkpoint runs/cpu-demo/checkpoints", "|piqa     |      0|acc     |"},
      {"build/mtnlg plan recipes/mtnlg-530b.yaml --gpus 2240", "whole run        80087 iterations, 2.7e+11 tokens"},
      {"build/mtnlg plan recipes/mtnlg-530b.yaml --gpus 2240 --gpu h100-80g --software megatron-core",
       "MFU              25.6% (HFU 34.1%) of 989 TFLOP/s peak"},
      {"build/mtnlg report runs/cpu-demo", "wrote runs/cpu-demo/report.html"},
  };
  REQUIRE(cmds.size() == std::size(steps));
  for (size_t i = 0; i < cmds.size(); ++i) {
    INFO(cmds[i]);
    REQUIRE(cmds[i].rfind(steps[i].prefix, 0) == 0);
    REQUIRE_THAT(section, Catch::Matchers::Contains(steps[i].phrase));  // the README still shows it
  }

  TempDir tmp("tour");
  fs::create_directories(tmp / "build");
  fs::create_symlink(MTNLG_BINARY, tmp / "build" / "mtnlg");
  auto corpus = make_demo_tree(fs::path(tmp.str()));
  INFO(corpus.out);
  REQUIRE(corpus.exit_code == 0);

  for (size_t i = 0; i < cmds.size(); ++i) {
    std::string cmd = cmds[i];
    if (i == 0) {  // keep the test short: 2 iterations (the final one still saves)
      const std::string from = "training.train_iters=20";
      const auto at = cmd.find(from);
      REQUIRE(at != std::string::npos);
      cmd.replace(at, from.size(), "training.train_iters=2");
    }
    auto r = run_command("cd " + tmp.str() + " && " + cmd + " 2>&1");
    INFO(cmd << "\n" << r.out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Matchers::Contains(steps[i].phrase));
  }
  CHECK(fs::exists(tmp / "runs" / "cpu-demo" / "eval.json"));
  CHECK(fs::exists(tmp / "runs" / "cpu-demo" / "report.html"));
}
