// `mtnlg checkpoint verify-resume` through the binary: a one-process checkpoint taken
// inside the batch ramp resumes under tp2 x pp2 x dp2 with ZeRO-1 with the one-process
// losses and grad norms, and bad input (a missing checkpoint, another model's checkpoint,
// a layout that does not divide the model or the batch) is exit 2 before any run.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "model/checkpoint.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

const std::string kRamp = test::source_dir() + "/recipes/tiny-ramp.yaml";
const std::string kMock = test::source_dir() + "/recipes/tiny-mock.yaml";
// A longer ramp than the recipe's: batches 4, 4, 4, 8, 8, 12, 16, ... so the iterations
// verified from a checkpoint at iteration 3 (4..6) change batch size twice.
const std::string kSets =
    "--set training.num_threads=1 --set 'training.rampup_batch_size={start: 4, increment: 4, ramp_tokens: 512}' "
    "--set training.train_iters=20";

test::RunResult run(const std::string& cmdline) {
  auto r = test::run_command(cmdline);
  UNSCOPED_INFO(cmdline << "\n" << r.out);
  return r;
}

// Trains RECIPE in one process until iteration `at` (training.exit_interval), saving in DIR/ckpt.
std::string checkpoint_at(const std::string& recipe, const test::TempDir& dir, int at, const std::string& sets) {
  const std::string root = dir.str() + "/ckpt";
  auto r = run(std::string(MTNLG_BINARY) + " train " + recipe + " --quiet " + sets + " --set logging.dir=" + dir.str() +
               "/run --set checkpoint.save=" + root + " --set training.exit_interval=" + std::to_string(at));
  REQUIRE(r.exit_code == 0);
  REQUIRE(model::ckpt::latest_iteration(root) == at);
  return root;
}

std::string verify(const std::string& ckpt, const std::string& recipe, const std::string& rest) {
  return std::string(MTNLG_BINARY) + " checkpoint verify-resume " + ckpt + " --recipe " + recipe + " " + rest;
}

}  // namespace

TEST_CASE("checkpoint verify-resume: one process and tp2 x pp2 x dp2 with ZeRO-1 agree through the ramp",
          "[mpi][verify-resume]") {
  test::TempDir d("verify-resume");
  const std::string root = checkpoint_at(kRamp, d, 3, kSets);
  const auto before = model::ckpt::inspect(root);

  // The container-safe mpirun of the other multi-rank tests (test::mpirun), as a template.
  const std::string launcher = "--launcher 'sh " + test::source_dir() + "/test/support/mpi/mpirun.sh {n}'";
  auto r =
      run(verify(root, kRamp,
                 kSets + " --layout-a tp=1,pp=1,dp=1 --layout-b tp=2,pp=2,dp=2,zero1=1 --iters 3 --tolerance 1e-6 " +
                     launcher + " --work-dir " + d.str() + "/work"));
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("layout B: tp=2 pp=2 dp=2 ZeRO-1, 8 processes, iterations 4..6"));
  CHECK_THAT(r.out, Contains("largest relative difference: loss"));
  CHECK_THAT(r.out, Contains("ok: 3 iterations from iteration 3 agree within 1.0e-06"));

  // Both runs logged iterations 4..6, and the ramp changed the batch inside them.
  for (const char* side : {"layout-a", "layout-b"}) {
    std::ifstream in(d.path() / "work" / side / "metrics.jsonl");
    std::vector<int64_t> its;
    std::set<int64_t> batches;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      its.push_back(j["iteration"].get<int64_t>());
      batches.insert(j["global_batch_size"].get<int64_t>());
    }
    INFO(side);
    CHECK(its == std::vector<int64_t>{4, 5, 6});
    CHECK(batches == std::set<int64_t>{8, 12});
    CHECK_FALSE(fs::exists(d.path() / "work" / side / "checkpoints"));  // the runs' own saves are removed
  }
  SECTION("a difference beyond --tolerance is exit 1 naming the first iteration that differs") {
    // Another order of summation differs in the last bits; with tolerance 0 any difference
    // fails (should the two ever agree bit for bit, the largest differences are 0).
    auto t = run(verify(root, kRamp,
                        kSets + " --layout-b tp=2,pp=2,dp=2,zero1=1 --iters 2 --tolerance 0 " + launcher +
                            " --work-dir " + d.str() + "/work"));
    if (t.exit_code == 1) {
      CHECK_THAT(t.out, Contains("mtnlg: error: layouts differ from iteration "));
    } else {
      CHECK(t.exit_code == 0);
      CHECK_THAT(t.out, Contains("largest relative difference: loss 0.00e+00 (iteration 0), grad norm 0.00e+00"));
    }
  }
  SECTION("a run that fails is exit 1 with its error line") {
    auto t = run("MTNLG_FAULT_INJECT=rank=5:iteration=4:mode=throw " +
                 verify(root, kRamp,
                        kSets + " --layout-b tp=2,pp=2,dp=2,zero1=1 --iters 2 " + launcher + " --work-dir " + d.str() +
                            "/work"));
    CHECK(t.exit_code == 1);
    CHECK_THAT(t.out, Contains("mtnlg: error: layout B (tp=2,pp=2,dp=2,zero1=1): the run exited 1: error on rank 5: "));
  }
  // The user's checkpoint was only read.
  CHECK(model::ckpt::latest_iteration(root) == 3);
  CHECK(model::ckpt::inspect(root).size() == before.size());
  CHECK_FALSE(fs::exists(model::ckpt::iteration_dir(root, 6)));
}

// A one-process checkpoint continued under context parallelism (each of 2 ranks holding
// half of every sequence, ZeRO-1 over dp x cp) agrees with the one-process run.
TEST_CASE("checkpoint verify-resume: context parallelism agrees with one process", "[mpi][verify-resume]") {
  test::TempDir d("verify-resume-cp");
  const std::string root = checkpoint_at(kRamp, d, 3, kSets);
  const std::string launcher = "--launcher 'sh " + test::source_dir() + "/test/support/mpi/mpirun.sh {n}'";
  auto r = run(verify(root, kRamp,
                      kSets + " --layout-a tp=1 --layout-b cp=2,zero1=1 --iters 2 --tolerance 1e-6 " + launcher +
                          " --work-dir " + d.str() + "/work"));
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("layout B: tp=1 pp=1 dp=1 cp=2 ZeRO-1, 2 processes, iterations 4..5"));
  CHECK_THAT(r.out, Contains("ok: 2 iterations from iteration 3 agree within 1.0e-06"));
}

TEST_CASE("checkpoint verify-resume: bad input is exit 2 with one line naming it, before any run",
          "[e2e][verify-resume]") {
  test::TempDir d("verify-resume-bad");
  const std::string mock = checkpoint_at(kMock, d, 2, "--set training.num_threads=1");
  const std::string work = " --work-dir " + d.str() + "/work";
  struct Case {
    std::string what, cmdline, says;
  };
  const Case cases[] = {
      {"missing checkpoint", verify(d.str() + "/nothing-here", kMock, "--layout-b tp=2" + work),
       "nothing-here: no such checkpoint directory"},
      {"another model's checkpoint", verify(mock, kRamp, "--layout-b tp=2" + work),
       "checkpoint has model.num_layers = 2 but the recipe says 8; a checkpoint continues the same network"},
      {"tp that does not divide the heads", verify(mock, kMock, "--layout-b tp=3" + work),
       "num_attention_heads (4) must be divisible by parallel.tensor_model_parallel_size (3)"},
      {"pp that does not divide the layers", verify(mock, kMock, "--layout-b pp=4" + work),
       "model.num_layers (2) must be divisible by parallel.pipeline_model_parallel_size (4)"},
      {"dp that does not divide the batch", verify(mock, kMock, "--layout-b tp=1,dp=3" + work),
       "must be divisible by micro_batch_size x data_parallel_size = 2 x 3"},
      {"a layout that is not one", verify(mock, kMock, "--layout-b tp=2,gpus=4" + work), "unknown key \"gpus\""},
      {"a launcher without {n}", verify(mock, kMock, "--layout-b tp=2 --launcher mpirun" + work), "must contain {n}"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto r = run(c.cmdline);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Contains(c.says));
    CHECK_THAT(r.out, Contains("mtnlg: error: "));
    CHECK_THAT(r.out, !Contains("layout A: "));  // refused before any run started
  }
  // The layout is named in the message when it is the layout that is wrong.
  CHECK_THAT(run(verify(mock, kMock, "--layout-b tp=3" + work)).out, Contains("--layout-b \"tp=3\": "));
}
