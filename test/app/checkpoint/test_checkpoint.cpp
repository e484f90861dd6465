// Checkpoints through the real binary: bit-exact resume (single process and (2,2,2) with
// ZeRO-1, batch ramp and dropout on), resume into another layout, offline convert,
// SIGTERM/SIGUSR1 handling, kill -9 during a save, non-finite steps, untrusted files.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/process/module_configs.hpp"
#include "core/safetensors.hpp"
#include "model/checkpoint.hpp"
#include "model/inference.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

const std::string kRecipe = test::source_dir() + "/recipes/tiny-ramp.yaml";
// 20 iterations with the ramp, dropout on: everything resume must restore is in play.
const std::string kSets =
    " --quiet --set training.train_iters=20 --set model.hidden_dropout=0.1 --set model.attention_dropout=0.1"
    " --set training.num_threads=1";

std::string launcher(int np) {
  if (np == 1) return std::string(MTNLG_BINARY);
  return test::mpirun(np) + MTNLG_BINARY;
}

test::RunResult train(int np, const std::string& dir, const std::string& extra, const std::string& env = "") {
  std::string cmd = env + " " + launcher(np) + " train " + kRecipe + kSets + " --set logging.dir=" + dir + " " + extra;
  auto r = test::run_command(cmd);
  UNSCOPED_INFO(cmd << "\n" << r.out);
  return r;
}

const char* kLayout222 =
    "--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 "
    "--set parallel.use_distributed_optimizer=true";

}  // namespace

TEST_CASE("checkpoint: 10 + SIGUSR1 save + resume 10 equals 20 straight, bit for bit", "[e2e]") {
  test::TempDir a("ck-straight"), b("ck-resumed");
  REQUIRE(train(1, a.str(), "").exit_code == 0);
  std::string ck = "--set checkpoint.save=" + b.str() + "/ckpt --set checkpoint.load=" + b.str() + "/ckpt";
  // The signal arrives during iteration 10: the run saves after it and exits 0.
  auto r1 = train(1, b.str(), ck, "MTNLG_FAULT_INJECT=rank=0:iteration=10:mode=sigusr1");
  REQUIRE(r1.exit_code == 0);
  REQUIRE(model::ckpt::latest_iteration(b.str() + "/ckpt") == 10);
  REQUIRE(train(1, b.str(), ck).exit_code == 0);
  auto la = test::read_losses(a.path()), lb = test::read_losses(b.path());
  REQUIRE(la.size() == 20);
  REQUIRE(lb.size() == 20);
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == la[i]);
}

TEST_CASE("checkpoint: training.exit_interval stops with a checkpoint; the resumed run equals 20 straight", "[e2e]") {
  test::TempDir a("ck-exit-straight"), b("ck-exit-resumed");
  REQUIRE(train(1, a.str(), "").exit_code == 0);
  std::string ck = "--set checkpoint.save=" + b.str() + "/ckpt --set checkpoint.load=" + b.str() + "/ckpt";
  auto r1 = train(1, b.str(), ck + " --set training.exit_interval=10");
  REQUIRE(r1.exit_code == 0);
  REQUIRE(model::ckpt::latest_iteration(b.str() + "/ckpt") == 10);
  REQUIRE(test::read_losses(b.path()).size() == 10);
  REQUIRE(train(1, b.str(), ck).exit_code == 0);
  auto la = test::read_losses(a.path()), lb = test::read_losses(b.path());
  REQUIRE(la.size() == 20);
  REQUIRE(lb.size() == 20);
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == la[i]);
  // Without a save location the recipe is refused before any work is done.
  auto bad = train(1, b.str(), "--set training.exit_interval=5");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out, Contains("training.exit_interval") && Contains("checkpoint.save"));
}

TEST_CASE("checkpoint: (2,2,2) with ZeRO-1 resumes bit for bit, and SIGTERM stops every rank", "[mpi]") {
  test::TempDir a("ck-mpi-straight"), b("ck-mpi-resumed");
  REQUIRE(train(8, a.str(), kLayout222).exit_code == 0);
  std::string ck = std::string(kLayout222) + " --set checkpoint.save=" + b.str() +
                   "/ckpt --set checkpoint.load=" + b.str() + "/ckpt";
  REQUIRE(train(8, b.str(), ck, "MTNLG_FAULT_INJECT=rank=5:iteration=10:mode=sigterm").exit_code == 0);
  REQUIRE(model::ckpt::latest_iteration(b.str() + "/ckpt") == 10);
  auto files = model::ckpt::inspect(b.str() + "/ckpt");
  int optim_files = 0;
  for (auto& e : fs::directory_iterator(model::ckpt::iteration_dir(b.str() + "/ckpt", 10)))
    optim_files += e.path().filename().string().rfind("optim_", 0) == 0;
  CHECK(optim_files == 8);  // one per (tp, pp, dp) shard under ZeRO-1
  for (auto& t : files) CHECK(t.checksum_ok);
  REQUIRE(train(8, b.str(), ck).exit_code == 0);
  auto la = test::read_losses(a.path()), lb = test::read_losses(b.path());
  REQUIRE(la.size() == 20);
  REQUIRE(lb.size() == 20);
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == la[i]);

  SECTION("any layout: the (2,2,2) checkpoint continues in (1,1,1) and (1,2,2), online and converted offline") {
    struct Target {
      const char* name;
      int np;
      std::string sets;
    };
    test::TempDir conv("ck-converted");
    auto cr = test::run_mtnlg("checkpoint convert --input " + b.str() + "/ckpt/iter_0000010 --output " + conv.str() +
                              " --tp 1 --pp 2");
    INFO(cr.out);
    REQUIRE(cr.exit_code == 0);
    const Target targets[] = {
        {"single", 1, "--set checkpoint.load=" + b.str() + "/ckpt/iter_0000010"},
        {"pp2-dp2", 4,
         "--set parallel.pipeline_model_parallel_size=2 --set checkpoint.load=" + b.str() + "/ckpt/iter_0000010"},
        {"converted-pp2", 2, "--set parallel.pipeline_model_parallel_size=2 --set checkpoint.load=" + conv.str()},
    };
    for (auto& t : targets) {
      test::TempDir d(std::string("ck-any-") + t.name);
      REQUIRE(train(t.np, d.str(), t.sets).exit_code == 0);
      auto l = test::read_losses(d.path());
      INFO(t.name);
      REQUIRE(l.size() == 10);  // iterations 11..20
      double worst = 0;
      for (size_t i = 0; i < l.size(); ++i)
        worst = std::max(worst, std::fabs(l[i] - la[10 + i]) / std::fabs(la[10 + i]));
      INFO("worst relative difference " << worst);
      CHECK(worst <= 1e-5);
    }
  }
}

TEST_CASE("checkpoint: kill -9 during a save leaves the previous checkpoint and latest intact", "[e2e]") {
  test::TempDir d("ck-kill");
  std::string root = d.str() + "/ckpt";
  std::string cmd = std::string("MTNLG_TEST_SAVE_DELAY_MS=4000 exec ") + MTNLG_BINARY + " train " + kRecipe + kSets +
                    " --set logging.dir=" + d.str() + " --set checkpoint.save=" + root +
                    " --set checkpoint.save_interval=5" + " --set training.train_iters=40 > " + d.str() +
                    "/log.txt 2>&1";
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until the save of iteration 10 is being written (5 was committed before it began).
  bool seen = false;
  for (int i = 0; i < 600 && !seen; ++i) {
    seen = fs::exists(model::ckpt::partial_dir(root, 10));
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  INFO(test::read_file(d.path() / "log.txt"));
  REQUIRE(seen);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(model::ckpt::latest_iteration(root) == 5);
  auto m = app::load_for_inference(root);
  CHECK(m.store.numel() > 0);
  // and training resumes from it: iterations 6..40 follow in metrics.jsonl
  auto r = train(1, d.str(), "--set checkpoint.load=" + root + " --set training.train_iters=40");
  REQUIRE(r.exit_code == 0);
  std::vector<int64_t> its;
  std::ifstream f(d.path() / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) its.push_back(nlohmann::json::parse(line)["iteration"].get<int64_t>());
  REQUIRE(its.size() >= 35);
  CHECK(its.back() == 40);
  CHECK(its[its.size() - 35] == 6);
}

TEST_CASE("checkpoint: K non-finite steps in a row stop the run with an error and a good checkpoint", "[e2e]") {
  test::TempDir d("ck-nan");
  std::string root = d.str() + "/ckpt";
  auto r = train(1, d.str(), "--set checkpoint.save=" + root + " --set training.max_nonfinite_in_a_row=3",
                 "MTNLG_FAULT_INJECT=rank=0:iteration=6:mode=nan");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Contains("3 non-finite losses/gradients in a row"));
  REQUIRE(model::ckpt::latest_iteration(root) == 8);
  auto st = model::ckpt::read_metadata(model::ckpt::resolve(root));
  CHECK(st.skipped_total == 3);
  CHECK(st.optimizer_steps == 5);  // the skipped steps did not update
  auto m = app::load_for_inference(root);
  for (int64_t i = 0; i < m.store.numel(); ++i) REQUIRE(std::isfinite(m.store.params().data<float>()[i]));
}

TEST_CASE("checkpoint: truncated, corrupted and foreign checkpoints exit 2 naming file and tensor", "[e2e]") {
  test::TempDir d("ck-bad");
  std::string root = d.str() + "/ckpt";
  REQUIRE(train(1, d.str(), "--set checkpoint.save=" + root + " --set training.train_iters=2").exit_code == 0);
  std::string it = model::ckpt::iteration_dir(root, 2);
  std::string shard = it + "/" + model::ckpt::model_file(0, 0);
  std::string original = test::read_file(shard);

  // corrupted: flip a byte near the end (inside the last tensor's data)
  std::string bad = original;
  bad[bad.size() - 3] ^= 0x5a;
  test::write_file(shard, bad);
  auto r = test::run_mtnlg("checkpoint inspect " + root);
  CHECK(r.exit_code == 2);
  r = train(1, d.str() + "/r1", "--set checkpoint.load=" + root);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("model_tp00_pp000.safetensors") && Contains("checksum mismatch") && Contains("tensor '"));

  // truncated
  test::write_file(shard, original.substr(0, original.size() / 2));
  r = train(1, d.str() + "/r2", "--set checkpoint.load=" + root);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("model_tp00_pp000.safetensors"));

  // foreign: a file that is not safetensors at all, and a huge claimed header
  test::write_file(shard, "this is not a checkpoint");
  r = train(1, d.str() + "/r3", "--set checkpoint.load=" + root);
  CHECK(r.exit_code == 2);
  std::string huge(8, '\xff');
  test::write_file(shard, huge + "{}");
  r = train(1, d.str() + "/r4", "--set checkpoint.load=" + root);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("header length"));

  // another network
  test::write_file(shard, original);
  r = train(1, d.str() + "/r5", "--set checkpoint.load=" + root + " --set model.hidden_size=64");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("hidden_size"));
  // latest pointing nowhere
  test::write_file(root + "/latest", "77\n");
  r = train(1, d.str() + "/r6", "--set checkpoint.load=" + root);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("latest"));
}

TEST_CASE("checkpoint: keep_last prunes old checkpoints; inspect reports them", "[e2e]") {
  test::TempDir d("ck-keep");
  std::string root = d.str() + "/ckpt";
  REQUIRE(train(1, d.str(),
                "--set checkpoint.save=" + root + " --set checkpoint.save_interval=4 --set checkpoint.keep_last=2")
              .exit_code == 0);
  int dirs = 0;
  for (auto& e : fs::directory_iterator(root)) dirs += e.is_directory();
  CHECK(dirs == 2);  // 16 and 20
  CHECK(model::ckpt::latest_iteration(root) == 20);
  auto r = test::run_mtnlg("checkpoint inspect " + root);
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("iteration 20") && Contains("model_tp00_pp000.safetensors") && Contains("checksums ok"));
}

TEST_CASE("checkpoint logits: the model's logits for given tokens, on the CPU and the test device alike", "[e2e]") {
  test::TempDir d("ck-logits");
  const std::string ck = d.str() + "/ckpt";
  REQUIRE(train(1, d.str(), "--set training.train_iters=2 --set checkpoint.save=" + ck).exit_code == 0);
  const std::string toks = "3,141,59,26,5,35,89,79";
  auto cpu = test::run_mtnlg("checkpoint logits --input " + ck + " --device cpu --tokens " + toks + " --output " +
                             d.str() + "/cpu.safetensors");
  INFO(cpu.out);
  REQUIRE(cpu.exit_code == 0);
  auto dev = test::run_mtnlg("checkpoint logits --input " + ck + " --device test --tokens " + toks + " --output " +
                             d.str() + "/test.safetensors");
  INFO(dev.out);
  REQUIRE(dev.exit_code == 0);
  auto a = safetensors::read(d.str() + "/cpu.safetensors"), b = safetensors::read(d.str() + "/test.safetensors");
  const Tensor& la = a.tensors.at("logits");
  REQUIRE(la.shape() == Shape{1, 8, 256});  // tiny-ramp's vocabulary, unpadded
  REQUIRE(a.tensors.at("tokens").data<int32_t>()[1] == 141);
  // The same logits in process (load_for_inference + logits_at), and on the test device.
  // Bitwise across processes, which holds because both sides run the same code on the same
  // kernels with the same thread split: this test binary and mtnlg select OpenBLAS's core in
  // one place (core/blas_core.hpp; `reliability 10` shows they agree), both use every core
  // of this machine, and OpenBLAS's sgemm and mtnlg's CPU kernels split rows, never a
  // reduction, between threads.
  model::LoadedModel m = app::load_for_inference(ck);
  auto chunk = model::whole_model_chunk(m.cfg, m.store);
  const std::vector<int32_t> ids{3, 141, 59, 26, 5, 35, 89, 79};
  std::vector<int64_t> rows{0, 1, 2, 3, 4, 5, 6, 7};
  Tensor ref = model::logits_at(*chunk, ids.data(), 1, 8, rows);
  for (int64_t t = 0; t < 8; ++t)
    for (int64_t v = 0; v < 256; ++v) {
      REQUIRE(la.data<float>()[t * 256 + v] == ref.data<float>()[t * ref.dim(1) + v]);
      REQUIRE(b.tensors.at("logits").data<float>()[t * 256 + v] == la.data<float>()[t * 256 + v]);
    }
  // Bad token lists are input errors.
  for (const char* bad : {"1,x", "1,,2", "-3", "1,256"}) {
    auto r =
        test::run_mtnlg("checkpoint logits --input " + ck + " --tokens=" + bad + " --output " + d.str() + "/bad.st");
    INFO(bad << ": " << r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Contains("--tokens"));
  }
}
