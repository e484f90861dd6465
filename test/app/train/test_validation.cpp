// Validation and test loss during training (app/train/validation.hpp): Megatron's log line at
// every eval_interval and at the end, the metrics.jsonl records, TensorBoard, the
// report's plot, and the same numbers on every layout (1 rank vs mpirun 2x2x2 and an
// interleaved pipeline).
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test/support/test_support.hpp"
#include "test/support/layouts.hpp"

using namespace mtnlg;

namespace {

struct HeldOut {
  int64_t iteration;
  std::string kind;  // validation | test
  double loss, ppl;
};

std::vector<HeldOut> read_held_out(const std::filesystem::path& dir) {
  std::vector<HeldOut> v;
  std::ifstream f(dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    for (const char* k : {"validation", "test"})
      if (j.contains(std::string(k) + "_loss"))
        v.push_back({j["iteration"].get<int64_t>(), k, j[std::string(k) + "_loss"].get<double>(),
                     j[std::string(k) + "_ppl"].get<double>()});
  }
  return v;
}

const char* kEval = " --set training.eval_interval=4 --set training.eval_iters=2";

test::RunResult run_layout(const test::TempDir& dir, int np, const std::string& sets, bool quiet = true) {
  const std::string args = " train " + test::source_dir() + "/recipes/tiny-ramp.yaml" + (quiet ? " --quiet" : "") +
                           " --set logging.dir=" + dir.str() + " --set training.num_threads=1" + kEval + " " + sets;
  const std::string cmd = np == 1 ? std::string(MTNLG_BINARY) + args
                                  : "sh " + test::source_dir() + "/test/support/mpi/mpirun.sh " + std::to_string(np) +
                                        " " + MTNLG_BINARY + args;
  return test::run_command(cmd);
}

}  // namespace

TEST_CASE("train: validation loss at every eval_interval and at the end, logged, recorded, plotted", "[e2e]") {
  test::TempDir dir("validation");
  auto r = run_layout(dir, 1, "--set logging.tensorboard=true", false);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  // tiny-ramp: 10 iterations, so evaluations after 4 and 8, then the end of training.
  CHECK_THAT(r.out, Catch::Matchers::Contains(" validation loss at iteration 4 | lm loss value: "));
  CHECK_THAT(r.out, Catch::Matchers::Contains(" validation loss at iteration 8 | lm loss value: "));
  CHECK_THAT(r.out, Catch::Matchers::Contains(" validation loss at iteration 10 on validation set | lm loss value: "));
  CHECK_THAT(r.out, Catch::Matchers::Contains(" validation loss at iteration 10 on test set | lm loss value: "));
  CHECK_THAT(r.out, Catch::Matchers::Contains(" | lm loss PPL: "));
  const auto h = read_held_out(dir.path());
  REQUIRE(h.size() == 4);
  CHECK((h[0].iteration == 4 && h[0].kind == "validation"));
  CHECK((h[1].iteration == 8 && h[1].kind == "validation"));
  CHECK((h[2].iteration == 10 && h[2].kind == "validation"));
  CHECK((h[3].iteration == 10 && h[3].kind == "test"));
  for (const auto& x : h) {
    CHECK(std::isfinite(x.loss));
    CHECK(x.ppl == Approx(std::exp(x.loss)).epsilon(1e-12));
    CHECK(x.loss < std::log(256.0) + 0.5);  // about uniform over the vocabulary, not garbage
  }
  // Training rows are untouched: 10 of them.
  CHECK(test::read_losses(dir.path()).size() == 10);
  // TensorBoard holds the validation scalars.
  bool tb = false;
  for (auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().filename().string().rfind("events.out.tfevents", 0) == 0)
      tb = tb || test::read_file(e.path()).find("validation/lm loss") != std::string::npos;
  CHECK(tb);
  // The report plots them and names the last values.
  auto rep = test::run_mtnlg("report " + dir.str());
  INFO(rep.out);
  REQUIRE(rep.exit_code == 0);
  const std::string html = test::read_file(dir.path() / "report.html");
  CHECK_THAT(html, Catch::Matchers::Contains("Validation loss"));
  CHECK_THAT(html, Catch::Matchers::Contains("Last validation loss (iteration 10)"));
  CHECK_THAT(html, Catch::Matchers::Contains("Test loss (iteration 10)"));
}

TEST_CASE("train: a resumed run evaluates the same validation samples", "[e2e]") {
  test::TempDir a("validation-whole"), b("validation-resumed");
  auto whole = run_layout(a, 1, "");
  REQUIRE(whole.exit_code == 0);
  // Stopped by SIGTERM during iteration 6 (saved after it), then resumed to the end.
  const std::string ck = "--set checkpoint.save=" + b.str() + "/ckpt --set checkpoint.load=" + b.str() + "/ckpt";
  auto first =
      test::run_command("MTNLG_FAULT_INJECT=rank=0:iteration=6:mode=sigterm " + std::string(MTNLG_BINARY) + " train " +
                        test::source_dir() + "/recipes/tiny-ramp.yaml --quiet --set logging.dir=" + b.str() +
                        " --set training.num_threads=1" + kEval + " " + ck);
  INFO(first.out);
  REQUIRE(first.exit_code == 0);
  CHECK(read_held_out(b.path()).size() == 1);  // iteration 4 only: no end-of-training evaluation when stopped
  auto second = run_layout(b, 1, ck);
  INFO(second.out);
  REQUIRE(second.exit_code == 0);
  const auto want = read_held_out(a.path()), got = read_held_out(b.path());
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(got[i].iteration == want[i].iteration);
    CHECK(got[i].kind == want[i].kind);
    CHECK(got[i].loss == want[i].loss);  // same layout, same samples: bit for bit
  }
}

TEST_CASE("train: validation loss is the same on every layout", "[mpi]") {
  test::TempDir ref_dir("validation-ref");
  auto r = run_layout(ref_dir, 1, "");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const auto ref = read_held_out(ref_dir.path());
  REQUIRE(ref.size() == 4);
  const auto layouts = test::layouts({"tp2-pp2-dp2", "pp4-v2"});
  for (const auto& l : layouts) {
    test::TempDir dir(std::string("validation-") + l.name);
    auto got_run = run_layout(dir, l.np, l.sets);
    INFO(l.name << "\n" << got_run.out);
    REQUIRE(got_run.exit_code == 0);
    const auto got = read_held_out(dir.path());
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      CHECK(got[i].iteration == ref[i].iteration);
      CHECK(got[i].kind == ref[i].kind);
      CHECK(std::fabs(got[i].loss - ref[i].loss) <= 1e-5 * std::fabs(ref[i].loss));
    }
  }
}
