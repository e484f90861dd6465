// The device code path, proven without a GPU: `training.device: test` puts
// every parameter, gradient, optimizer state, activation and step statistic on the test
// device (host memory the process treats as a device; core/tensor.hpp), where ops run
// their CPU kernels but host code may not read: a host read of device memory anywhere in
// train, validation, checkpoint save/load or eval is an error there. The runs must give
// the plain CPU run's losses bit for bit, read device memory once per step, and trade
// checkpoints with the CPU in both directions; single process and under mpirun with
// tp x pp x dp = 2 x 2 x 2.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/process/module_configs.hpp"
#include "model/checkpoint.hpp"
#include "model/inference.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;

namespace {

struct Step {
  double loss = 0, grad_norm = 0;
  int64_t host_reads = -1;
};

std::vector<Step> read_steps(const fs::path& run) {
  std::vector<Step> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("grad_norm")) continue;  // validation lines
    out.push_back({j["loss"].get<double>(), j["grad_norm"].get<double>(), j.value("host_reads", int64_t{0})});
  }
  return out;
}

test::RunResult train(const test::TempDir& run, const std::string& sets, int np = 1, const std::string& env = "") {
  UNSCOPED_INFO(test::train_command(test::source_dir() + "/recipes/tiny-ramp.yaml", run.str(),
                                    "--set training.num_threads=1 " + sets, np, env));
  auto r = test::run_train(test::source_dir() + "/recipes/tiny-ramp.yaml", run.str(),
                           "--set training.num_threads=1 " + sets, np, env);
  UNSCOPED_INFO(r.out);
  return r;
}

// Same losses and grad norms, bit for bit; the device run read device memory once a step.
void require_same(const std::vector<Step>& cpu, const std::vector<Step>& dev, size_t n) {
  REQUIRE(cpu.size() == n);
  REQUIRE(dev.size() == n);
  for (size_t i = 0; i < n; ++i) {
    INFO("iteration " << i + 1);
    CHECK(dev[i].loss == cpu[i].loss);
    CHECK(dev[i].grad_norm == cpu[i].grad_norm);
    CHECK(cpu[i].host_reads == 0);
    CHECK(dev[i].host_reads == 1);
  }
}

}  // namespace

TEST_CASE("test device: training gives the CPU's losses bit for bit with one host read per step", "[e2e]") {
  for (const char* prec : {"fp32", "bf16", "fp16"}) {
    INFO(prec);
    const std::string sets = std::string("--set training.precision=") + prec +
                             " --set optimizer.initial_loss_scale=65536 --set training.train_iters=6";
    test::TempDir cpu(std::string("dev-cpu-") + prec), dev(std::string("dev-test-") + prec);
    REQUIRE(train(cpu, sets + " --set training.device=cpu").exit_code == 0);
    REQUIRE(train(dev, sets + " --set training.device=test").exit_code == 0);
    require_same(read_steps(cpu.path()), read_steps(dev.path()), 6);
  }
}

TEST_CASE("test device: checkpoints move between the test device and the CPU and resume bit for bit", "[e2e]") {
  const std::string sets = "--set training.precision=bf16 --set training.train_iters=8";
  test::TempDir straight("dev-straight"), a("dev-a"), b("dev-b");
  REQUIRE(train(straight, sets + " --set training.device=cpu").exit_code == 0);
  // 4 iterations on the test device, saved; resumed on the CPU to 8 ...
  const std::string ck = " --set checkpoint.save=" + a.str() + "/ck --set checkpoint.load=" + a.str() + "/ck";
  // (stopped by SIGTERM at 4: a shorter train_iters would change the lr schedule)
  const std::string stop_at_4 = "MTNLG_FAULT_INJECT=rank=0:iteration=4:mode=sigterm";
  REQUIRE(train(a, sets + ck + " --set training.device=test", 1, stop_at_4).exit_code == 0);
  REQUIRE(model::ckpt::latest_iteration(a.str() + "/ck") == 4);
  REQUIRE(train(a, sets + ck + " --set training.device=cpu").exit_code == 0);
  // ... and the reverse: 4 on the CPU, resumed on the test device.
  const std::string ck2 = " --set checkpoint.save=" + b.str() + "/ck --set checkpoint.load=" + b.str() + "/ck";
  REQUIRE(train(b, sets + ck2 + " --set training.device=cpu", 1, stop_at_4).exit_code == 0);
  REQUIRE(model::ckpt::latest_iteration(b.str() + "/ck") == 4);
  REQUIRE(train(b, sets + ck2 + " --set training.device=test").exit_code == 0);
  const auto s = read_steps(straight.path()), ra = read_steps(a.path()), rb = read_steps(b.path());
  REQUIRE(s.size() == 8);
  REQUIRE(ra.size() == 8);
  REQUIRE(rb.size() == 8);
  for (size_t i = 0; i < 8; ++i) {
    INFO("iteration " << i + 1);
    CHECK(ra[i].loss == s[i].loss);
    CHECK(rb[i].loss == s[i].loss);
  }
}

TEST_CASE("test device: tp2 x pp2 x dp2 (ZeRO-1, bf16, validation, checkpoints) equals the CPU run", "[mpi]") {
  const std::string sets =
      "--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 "
      "--set parallel.use_distributed_optimizer=true --set training.precision=bf16 --set training.train_iters=6";
  test::TempDir cpu("dev8-cpu"), dev("dev8-test"), resumed("dev8-resumed");
  REQUIRE(train(cpu, sets + " --set training.device=cpu", 8).exit_code == 0);
  REQUIRE(train(dev, sets + " --set training.device=test", 8).exit_code == 0);
  require_same(read_steps(cpu.path()), read_steps(dev.path()), 6);
  // Interleaved pipeline + sequence parallel on the test device, saved at 3 and resumed.
  const std::string il =
      "--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 "
      "--set parallel.num_layers_per_virtual_pipeline_stage=2 --set parallel.sequence_parallel=true "
      "--set training.train_iters=6";
  test::TempDir il_cpu("dev8-il-cpu");
  REQUIRE(train(il_cpu, il + " --set training.device=cpu", 8).exit_code == 0);
  const std::string ck = " --set checkpoint.save=" + resumed.str() + "/ck --set checkpoint.load=" + resumed.str() +
                         "/ck --set checkpoint.save_interval=3";
  REQUIRE(
      train(resumed, il + ck + " --set training.device=test", 8, "MTNLG_FAULT_INJECT=rank=5:iteration=3:mode=sigterm")
          .exit_code == 0);
  REQUIRE(model::ckpt::latest_iteration(resumed.str() + "/ck") == 3);
  REQUIRE(train(resumed, il + ck + " --set training.device=test", 8).exit_code == 0);
  require_same(read_steps(il_cpu.path()), read_steps(resumed.path()), 6);
}

TEST_CASE("test device: eval under mpirun (tp2 x pp2) gives the CPU's log-likelihoods", "[mpi]") {
  const std::string src = test::source_dir();
  if (!fs::exists(src + "/third_party/gpt2/vocab.json"))
    FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("dev-eval");
  Recipe r = load_recipe(src + "/test/fixtures/eval/tiny-model.yaml");
  model::LoadedModel m = model::make_random_model(app::gpt_config(r), 11);
  app::save_whole_model(d.str() + "/ckpt", r, m.store, 0);
  const std::string common = "OMP_NUM_THREADS=1 sh " + src + "/test/support/mpi/mpirun.sh 4 " + MTNLG_BINARY +
                             " eval --checkpoint " + d.str() + "/ckpt --tasks piqa,lambada_openai --data-dir " + src +
                             "/test/fixtures/eval --no-progress --vocab-file " + src +
                             "/third_party/gpt2/vocab.json --merge-file " + src +
                             "/third_party/gpt2/merges.txt --set parallel.tensor_model_parallel_size=2"
                             " --set parallel.pipeline_model_parallel_size=2";
  for (const char* dev : {"cpu", "test"}) {
    auto res = test::run_command(common + " --device " + dev + " --log-samples " + d.str() + "/" + dev + ".jsonl");
    INFO(res.out);
    REQUIRE(res.exit_code == 0);
  }
  CHECK(test::read_file(d.path() / "cpu.jsonl") == test::read_file(d.path() / "test.jsonl"));
  CHECK(test::read_file(d.path() / "cpu.jsonl").size() > 100);
}

TEST_CASE("test device: a bad --device or training.device exits 2 naming it", "[e2e]") {
  auto r = test::run_mtnlg("train " + test::source_dir() + "/recipes/tiny-mock.yaml --set training.device=tpu");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("device") != std::string::npos);
  CHECK(r.out.find("auto|cpu|cuda|test") != std::string::npos);
  // Here (no GPU, or a build without CUDA) asking for cuda is bad input, not a crash.
  test::TempDir d("dev-nocuda");
  auto c =
      test::run_command("CUDA_VISIBLE_DEVICES= " + std::string(MTNLG_BINARY) + " train " + test::source_dir() +
                        "/recipes/tiny-mock.yaml --quiet --set logging.dir=" + d.str() + " --set training.device=cuda");
  INFO(c.out);
  CHECK(c.exit_code == 2);
  CHECK(c.out.find("training.device: cuda") != std::string::npos);
}

TEST_CASE("test device: single-process eval and generate (KV cache) give the CPU's output", "[e2e]") {
  const std::string src = test::source_dir();
  if (!fs::exists(src + "/third_party/gpt2/vocab.json"))
    FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("dev-eval1");
  const std::string model = " --random-init " + src + "/test/fixtures/eval/tiny-model.yaml --vocab-file " + src +
                            "/third_party/gpt2/vocab.json --merge-file " + src + "/third_party/gpt2/merges.txt";
  for (const char* dev : {"cpu", "test"}) {
    auto e = test::run_command("OMP_NUM_THREADS=1 " + std::string(MTNLG_BINARY) + " eval" + model +
                               " --tasks piqa,lambada_openai --data-dir " + src +
                               "/test/fixtures/eval --no-progress --device " + dev + " --log-samples " + d.str() + "/" +
                               dev + ".jsonl");
    INFO(e.out);
    REQUIRE(e.exit_code == 0);
    auto g = test::run_command("OMP_NUM_THREADS=1 " + std::string(MTNLG_BINARY) + " generate" + model +
                               " --prompt 'Q: 12 # 3 = 4' --max-new-tokens 12 --seed 5 --no-echo --device " + dev +
                               " > " + d.str() + "/" + dev + ".txt");
    INFO(g.out);
    REQUIRE(g.exit_code == 0);
  }
  CHECK(test::read_file(d.path() / "cpu.jsonl") == test::read_file(d.path() / "test.jsonl"));
  CHECK(test::read_file(d.path() / "cpu.txt") == test::read_file(d.path() / "test.txt"));
  CHECK(test::read_file(d.path() / "cpu.txt").size() > 0);
}
