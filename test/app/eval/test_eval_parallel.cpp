// mtnlg eval under mpirun with the model split tp x pp gives the single-process numbers:
// the same accuracies and per-request log-likelihoods within 1e-4.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/process/module_configs.hpp"
#include "model/inference.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;

namespace {
// A random model of `r` (built by `cfg`) scored by eval in one process and under mpirun
// split tp2 x pp2: the same accuracies, per-request log-likelihoods within 1e-4.
void check_split_eval(const Recipe& r, const model::GptConfig& cfg, const std::string& tag) {
  const std::string src = test::source_dir();
  if (!std::filesystem::exists(src + "/third_party/gpt2/vocab.json"))
    FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  test::TempDir d("eval-par-" + tag);
  model::LoadedModel m = model::make_random_model(cfg, 11);
  app::save_whole_model(d.str() + "/ckpt", r, m.store, 0);
  const std::string common = " eval --checkpoint " + d.str() +
                             "/ckpt --tasks piqa,hellaswag,lambada_openai,winogrande --data-dir " + src +
                             "/test/fixtures/eval --num-fewshot 1 --no-progress --vocab-file " + src +
                             "/third_party/gpt2/vocab.json --merge-file " + src + "/third_party/gpt2/merges.txt";
  auto one = test::run_command("OMP_NUM_THREADS=1 " + std::string(MTNLG_BINARY) + common + " --output " + d.str() +
                               "/one.json --log-samples " + d.str() + "/one.jsonl");
  INFO(one.out);
  REQUIRE(one.exit_code == 0);
  auto par =
      test::run_command("OMP_NUM_THREADS=1 sh " + src + "/test/support/mpi/mpirun.sh 4 " + MTNLG_BINARY + common +
                        " --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2"
                        " --output " +
                        d.str() + "/par.json --log-samples " + d.str() + "/par.jsonl");
  INFO(par.out);
  REQUIRE(par.exit_code == 0);
  REQUIRE(par.out.find("split tp=2 pp=2 over 4 ranks") != std::string::npos);
  auto a = nlohmann::json::parse(test::read_file(d.path() / "one.json"))["results"];
  auto b = nlohmann::json::parse(test::read_file(d.path() / "par.json"))["results"];
  REQUIRE(a.size() == 4);
  for (auto& [task, metrics] : a.items())
    for (auto& [k, v] : metrics.items()) {
      INFO(task << "." << k);
      if (k == "acc" || k == "acc_norm") CHECK(b[task][k] == v);
      if (v.is_number()) CHECK(b[task][k].get<double>() == Approx(v.get<double>()).epsilon(1e-4));
    }
  std::ifstream fa(d.path() / "one.jsonl"), fb(d.path() / "par.jsonl");
  int n = 0;
  for (std::string la, lb; std::getline(fa, la) && std::getline(fb, lb); ++n) {
    auto ja = nlohmann::json::parse(la), jb = nlohmann::json::parse(lb);
    REQUIRE(ja["loglikelihoods"].size() == jb["loglikelihoods"].size());
    for (size_t i = 0; i < ja["loglikelihoods"].size(); ++i) {
      CHECK(std::fabs(ja["loglikelihoods"][i].get<double>() - jb["loglikelihoods"][i].get<double>()) <= 1e-4);
      CHECK(ja["is_greedy"][i] == jb["is_greedy"][i]);
    }
  }
  CHECK(n > 10);
}
}  // namespace

TEST_CASE("eval: tp2 x pp2 under mpirun equals the single process", "[mpi]") {
  const Recipe r = load_recipe(test::source_dir() + "/test/fixtures/eval/tiny-model.yaml");
  check_split_eval(r, app::gpt_config(r), "gpt");
}

// MoE layers (every token to its k experts, no capacity) run whole on each tp rank.
TEST_CASE("eval: an MoE model split tp2 x pp2 under mpirun equals the single process", "[mpi]") {
  const Recipe r = load_recipe(test::source_dir() + "/test/fixtures/eval/tiny-model.yaml",
                               {"model.num_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=48",
                                "model.add_bias_linear=false", "model.moe_shared_expert_intermediate_size=32"});
  check_split_eval(r, app::inference_config(r), "moe");
}
