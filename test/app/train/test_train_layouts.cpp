// Layout invariance (docs/ARCHITECTURE.md "Invariants"): the same recipe and seed, fp32, dropout 0,
// with the batch ramp on, gives the same loss at every iteration under every
// (tp, pp, dp, cp, virtual stages, ZeRO-1, sequence parallel, recompute) layout as the
// single-process run, within 1e-5 relative. Each layout runs the real binary under
// mpirun (test/support/mpi/mpirun.sh) and the losses are read back from metrics.jsonl.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/safetensors.hpp"
#include "model/checkpoint.hpp"
#include "test/support/test_support.hpp"
#include "test/support/layouts.hpp"

using namespace mtnlg;

namespace {

// tiny-ramp.yaml as a Llama-family model: rotary positions, RMSNorm, SwiGLU, 4 query heads
// in 2 key/value groups (one group per rank at tp 2), untied output layer, no biases (and,
// in one case, Qwen3's q/k norms).
const std::string kLlama =
    "--set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true "
    "--set model.ffn_hidden_size=80 --set model.num_query_groups=2 "
    "--set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false ";

// The worst relative difference of two loss curves of the same length.
double worst_relative(const std::vector<double>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::fabs(ref[i]));
  return worst;
}

// The losses of tiny-ramp.yaml under `sets` on np processes; with `keep`, the run's
// checkpoint after its last iteration is kept in `keep`'s directory (ckpt/).
std::vector<double> run_layout(const std::string& tag, int np, const std::string& sets,
                               const test::TempDir* keep = nullptr) {
  test::TempDir dir("layout-" + tag);
  const std::string recipe = test::source_dir() + "/recipes/tiny-ramp.yaml",
                    all = "--set training.num_threads=1 " + sets +
                          (keep ? " --set checkpoint.save=" + keep->str() + "/ckpt" : std::string());
  auto r = test::run_train(recipe, dir.str(), all, np);
  INFO(tag << ": " << test::train_command(recipe, dir.str(), all, np) << "\n" << r.out);
  REQUIRE(r.exit_code == 0);
  return test::read_losses(dir.path());
}

// Parameter `name` of the tp rank's shard of the last checkpoint under `root`.
Tensor saved_param(const std::string& root, int64_t tp_rank, const std::string& name) {
  const auto it = model::ckpt::latest_iteration(root);
  REQUIRE(it);
  return safetensors::read(model::ckpt::iteration_dir(root, *it) + "/" + model::ckpt::model_file(tp_rank, 0))
      .tensors.at(name);
}

}  // namespace

TEST_CASE("train: every parallel layout reproduces the single-process losses", "[mpi]") {
  const std::vector<double> ref = run_layout("ref", 1, "");
  REQUIRE(ref.size() == 10);
  const auto layouts = test::layouts({"tp2", "tp4", "pp2", "pp4", "pp4-v2", "dp2", "dp4", "tp2-pp2-dp2",
                                      "tp2-pp2-dp2-zero1", "tp2-dp2-sp", "tp2-pp2-dp2-recompute"});
  for (const auto& l : layouts) {
    auto got = run_layout(l.name, l.np, l.sets);
    INFO(l.name);
    const double worst = worst_relative(got, ref);
    INFO("worst relative loss difference " << worst);
    CHECK(worst <= 1e-5);
  }
  // the loss must actually move, or the comparison proves nothing
  CHECK(ref.back() < ref.front());
}

TEST_CASE("train: a Llama-family model reproduces the single-process losses under parallel layouts", "[mpi]") {
  const std::vector<double> ref = run_layout("llama-ref", 1, kLlama);
  REQUIRE(ref.size() == 10);
  const auto layouts = test::layouts({"tp2-dp2-sp", "pp2-v2", "tp2-pp2-dp2-zero1", "tp2-pp2-full"});
  for (const auto& l : layouts) {
    auto got = run_layout("llama-" + l.name, l.np, kLlama + l.sets);
    INFO("llama " << l.name);
    const double worst = worst_relative(got, ref);
    INFO("worst relative loss difference " << worst);
    CHECK(worst <= 1e-5);
  }
  // Qwen3's per-head q/k norms: their weights are replicated over tp while each tp rank
  // norms its own heads, so their gradients are summed over tp (without sequence
  // parallelism too): both tp ranks end with the same weights bit for bit (Adam's steps
  // from each rank's partial gradient alone would differ), and the run differs from the
  // Llama's without them.
  const std::string qk = kLlama + "--set model.qk_layernorm=true ";
  const std::vector<double> qk_ref = run_layout("qk-ref", 1, qk);
  CHECK(worst_relative(qk_ref, ref) > 1e-4);
  test::TempDir kept("layout-qk-tp2-ckpt");
  const test::Layout tp2 = test::layouts({"tp2"}).front();
  const double qk_worst = worst_relative(run_layout("qk-tp2", tp2.np, qk + tp2.sets, &kept), qk_ref);
  INFO("qk_layernorm tp2: worst relative loss difference " << qk_worst);
  CHECK(qk_worst <= 1e-5);
  for (const char* w : {"layers.1.attention.q_layernorm.weight", "layers.0.attention.k_layernorm.weight"}) {
    INFO(w);
    const Tensor a = saved_param(kept.str() + "/ckpt", 0, w), b = saved_param(kept.str() + "/ckpt", 1, w);
    REQUIRE(a.numel() == 8);
    CHECK(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.nbytes())) == 0);
  }
  // The loss must move by far more than the tolerance, or the comparison proves nothing
  // (on mock tokens this model stays near ln 256 for 10 iterations, moving by ~3e-3).
  double moved = 0;
  for (double l : ref) moved = std::max(moved, std::fabs(l - ref.front()) / ref.front());
  INFO("largest relative move of the loss " << moved);
  CHECK(moved > 1e-3);
}

// Context parallelism: each cp rank holds two of a sequence's 2 cp chunks, attention runs
// across the group (p2p ring, a2a, all_gather) and the loss is the mean over every token of
// the global batch, so a cp run is the one-process run, for the GPT (learned positions) and
// a GQA / MQA Llama (rotary positions at the rows' global positions).
TEST_CASE("train: context-parallel layouts reproduce the single-process losses", "[mpi]") {
  const std::vector<double> ref = run_layout("cp-ref", 1, "");
  REQUIRE(ref.size() == 10);
  for (const auto& l : test::layouts({"cp2", "cp4", "cp2-allgather", "cp2-tp2-sp", "cp2-pp2", "cp2-dp2-zero1"})) {
    INFO(l.name);
    const double worst = worst_relative(run_layout(l.name, l.np, l.sets), ref);
    INFO("worst relative loss difference " << worst);
    CHECK(worst <= 1e-5);
  }
  const std::vector<double> llama = run_layout("cp-llama-ref", 1, kLlama);
  for (const auto& l : test::layouts({"cp2", "cp2-a2a", "cp4-a2a+p2p", "cp2-tp2-sp", "cp2-pp2-v2-full"})) {
    INFO("llama " << l.name);
    const double worst = worst_relative(run_layout("llama-" + l.name, l.np, kLlama + l.sets), llama);
    INFO("worst relative loss difference " << worst);
    CHECK(worst <= 1e-5);
  }
  const std::string mqa = kLlama + "--set model.num_query_groups=1 ";
  const std::vector<double> mqa_ref = run_layout("cp-mqa-ref", 1, mqa);
  CHECK(worst_relative(mqa_ref, llama) > 1e-4);  // a different model, or the comparison proves nothing
  const test::Layout cp4 = test::layouts({"cp4"}).front();
  const double mqa_worst = worst_relative(run_layout("mqa-cp4", cp4.np, mqa + cp4.sets), mqa_ref);
  INFO("mqa cp4: worst relative loss difference " << mqa_worst);
  CHECK(mqa_worst <= 1e-5);
}

// The device code path of context parallelism (training.device test: device tensors
// through the exchange over the cp group, the K/V buffer and the blocks as ops on the
// device): cp2 and cp2 x tp2 with sequence parallelism reproduce the one-process CPU run.
// The CUDA kernels under the same layouts: test/emulator/e2e.sh, step cp.
TEST_CASE("train: context parallelism on the test device reproduces the single-process losses", "[mpi]") {
  const std::vector<double> ref = run_layout("cp-dev-ref", 1, "");
  for (const auto& l : test::layouts({"cp2", "cp2-tp2-sp", "cp2-a2a"})) {
    INFO(l.name);
    const double worst = worst_relative(run_layout("dev-" + l.name, l.np, l.sets + " --set training.device=test"), ref);
    INFO("worst relative loss difference " << worst);
    CHECK(worst <= 1e-5);
  }
}

// Checkpoints stay layout-free: a cp4 run with ZeRO-1 (4 optimizer shards over dp x cp)
// stopped after 5 iterations continues at cp1, under tp2 x pp2 and at cp2 x dp2 with
// ZeRO-1, each giving the uninterrupted run's losses for iterations 6-10.
TEST_CASE("train: a context-parallel checkpoint resumes under other layouts", "[mpi]") {
  const std::vector<double> ref = run_layout("cp-resume-ref", 1, "");
  REQUIRE(ref.size() == 10);
  test::TempDir saved("cp4-saved");
  const std::string ck = saved.str() + "/ckpt";
  const test::Layout cp4 = test::layouts({"cp4"}).front();
  const std::vector<double> first =
      run_layout("cp4-first", cp4.np,
                 cp4.sets +
                     " --set parallel.use_distributed_optimizer=true --set training.exit_interval=5 "
                     "--set checkpoint.save=" +
                     ck);
  REQUIRE(first.size() == 5);
  const std::string meta = test::read_file(model::ckpt::iteration_dir(ck, 5) + "/metadata.json");
  CHECK(meta.find("\"context_parallel_size\": 4") != std::string::npos);
  for (const auto& l : test::layouts({"single-none", "tp2-pp2-full", "cp2-dp2-zero1"})) {
    INFO("resumed under " << l.name);
    test::TempDir copy("cp4-resume-" + l.name);
    std::filesystem::copy(ck, copy.str() + "/ckpt", std::filesystem::copy_options::recursive);
    const std::vector<double> rest =
        run_layout("cp-resume-" + l.name, l.np, l.sets + " --set checkpoint.load=" + copy.str() + "/ckpt");
    REQUIRE(rest.size() == 5);
    const std::vector<double> want(ref.begin() + 5, ref.end());
    const double worst = worst_relative(rest, want);
    INFO("worst relative loss difference " << worst);
    CHECK(worst <= 1e-5);
  }
}
