// Layout invariance for mixture-of-experts models (docs/specs/moe.md "Expert parallelism"):
// tiny-ramp.yaml as a Llama-family MoE (4 SwiGLU experts, top-2, the balancing and z
// losses), fp32, dropless, trained for the 10 iterations of its batch ramp, gives the
// single-process loss and balancing loss at every iteration under expert parallelism over
// dp, over tp's ranks with sequence parallelism, within pipeline stages (interleaved, with
// full recompute), with ZeRO-1 over the experts' replicas, with each expert's width split
// over ranks (expert tensor parallelism, alone and as Megatron-Core's default etp = tp),
// under context parallelism —
// and a checkpoint saved under one expert layout continues under others. Each run is the real binary under mpirun.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <nlohmann/json.hpp>

#include "model/checkpoint.hpp"
#include "test/support/layouts.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;

namespace {

const std::string kMoe =
    "--set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true "
    "--set model.ffn_hidden_size=80 --set model.num_query_groups=2 "
    "--set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false "
    "--set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=24 "
    "--set model.moe_aux_loss_coeff=1e-2 --set model.moe_z_loss_coeff=1e-3 "
    "--set parallel.expert_tensor_parallel_size=1 ";
// DeepSeek-style sigmoid routing with the expert bias, and Qwen2-MoE's gated shared expert.
const std::string kSigmoidShared =
    "--set model.moe_router_score_function=sigmoid --set model.moe_router_enable_expert_bias=true "
    "--set model.moe_router_topk_scaling_factor=2.5 --set model.moe_shared_expert_intermediate_size=16 "
    "--set model.moe_shared_expert_gate=true --set model.moe_input_jitter_eps=0.05 ";

struct Curve {
  std::vector<double> loss, balance;
};

// The LM and balancing losses per iteration of tiny-ramp.yaml as an MoE under `sets`.
Curve run_moe(const std::string& tag, int np, const std::string& sets) {
  test::TempDir dir("moe-layout-" + tag);
  const std::string out = dir.str();
  const std::string recipe = test::source_dir() + "/recipes/tiny-ramp.yaml",
                    all = "--set training.num_threads=1 " + kMoe + sets;
  auto r = test::run_train(recipe, out, all, np);
  INFO(tag << ": " << test::train_command(recipe, out, all, np) << "\n" << r.out);
  REQUIRE(r.exit_code == 0);
  Curve c;
  std::istringstream lines(test::read_file(out + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    c.loss.push_back(j["loss"].get<double>());
    c.balance.push_back(j["moe_load_balancing_loss"].get<double>());
  }
  return c;
}

double worst_relative(const std::vector<double>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::fabs(ref[i]));
  return worst;
}

void check_same(const Curve& got, const Curve& ref) {
  const double loss = worst_relative(got.loss, ref.loss), balance = worst_relative(got.balance, ref.balance);
  INFO("worst relative difference: loss " << loss << ", balancing loss " << balance);
  CHECK(loss <= 1e-5);
  CHECK(balance <= 1e-5);
}

}  // namespace

TEST_CASE("train: expert-parallel layouts reproduce the single-process MoE losses", "[mpi]") {
  const Curve ref = run_moe("ref", 1, "");
  REQUIRE(ref.loss.size() == 10);
  // The routing changes as the routers learn (on mock data the LM loss barely can), or the
  // comparison proves little.
  const auto [lo, hi] = std::minmax_element(ref.balance.begin(), ref.balance.end());
  CHECK(*hi - *lo > 1e-3);
  for (const auto& l : test::layouts({"ep2", "ep4", "tp2-sp", "tp2-sp-ep2", "pp2-ep2", "ep2-dp4-zero1", "etp2",
                                      "tp2-sp-etp2", "etp2-ep2-zero1", "cp2-ep2", "cp2-tp2-sp-ep2"})) {
    INFO(l.name);
    check_same(run_moe(l.name, l.np, l.sets), ref);
  }
  // GELU experts (fc1 in one part) split over etp.
  const Curve gelu = run_moe("gelu-ref", 1, "--set model.swiglu=false ");
  check_same(run_moe("gelu-etp2", 2, "--set model.swiglu=false " + test::layouts({"etp2"}).front().sets), gelu);
  // Sigmoid scores with the expert bias (updated from the whole batch's counts) and a
  // gated shared expert, across tp's ranks and interleaved stages with full recompute.
  const Curve sig = run_moe("sigmoid-ref", 1, kSigmoidShared);
  for (const auto& l : test::layouts({"tp2-sp-ep2", "pp2-v2-full-ep2"})) {
    INFO("sigmoid, shared expert: " << l.name);
    check_same(run_moe("sigmoid-" + l.name, l.np, kSigmoidShared + l.sets), sig);
  }
}

// An ep2 x dp4 run with ZeRO-1 stopped after 5 iterations writes the experts per
// expert-parallel rank (their optimizer state per replica) and continues in one process,
// at ep4 with ZeRO-1 and with each expert's width split over 2 ranks, each giving the
// uninterrupted run's losses for iterations 6-10.
TEST_CASE("train: an expert-parallel checkpoint resumes under other expert layouts", "[mpi]") {
  const Curve ref = run_moe("resume-ref", 1, "");
  test::TempDir saved("moe-ep2-saved");
  const std::string ck = saved.str() + "/ckpt";
  const test::Layout ep2 = test::layouts({"ep2-dp4-zero1"}).front();
  const Curve first =
      run_moe("ep2-first", ep2.np, ep2.sets + " --set training.exit_interval=5 --set checkpoint.save=" + ck);
  REQUIRE(first.loss.size() == 5);
  const std::string it = model::ckpt::iteration_dir(ck, 5);
  for (const char* f : {"model_experts_etp00_ep000_pp000.safetensors", "model_experts_etp00_ep001_pp000.safetensors",
                        "optim_experts_etp00_ep001_pp000_dp001.safetensors", "optim_tp00_pp000_dp003.safetensors"})
    CHECK(std::filesystem::exists(it + "/" + f));
  const std::string meta = test::read_file(it + "/metadata.json");
  CHECK(meta.find("\"expert_model_parallel_size\": 2") != std::string::npos);
  for (const auto& l : test::layouts({"single-none", "ep4-zero1", "etp2-ep2-zero1"})) {
    INFO("resumed under " << l.name);
    test::TempDir copy("moe-resume-" + l.name);
    std::filesystem::copy(ck, copy.str() + "/ckpt", std::filesystem::copy_options::recursive);
    const Curve rest = run_moe("resume-" + l.name, l.np, l.sets + " --set checkpoint.load=" + copy.str() + "/ckpt");
    REQUIRE(rest.loss.size() == 5);
    const std::vector<double> want(ref.loss.begin() + 5, ref.loss.end());
    const double worst = worst_relative(rest.loss, want);
    INFO("worst relative loss difference " << worst);
    CHECK(worst <= 1e-5);
  }
  // A lost expert file is named before anything trains.
  test::TempDir broken("moe-resume-broken");
  std::filesystem::copy(ck, broken.str() + "/ckpt", std::filesystem::copy_options::recursive);
  std::filesystem::remove(model::ckpt::iteration_dir(broken.str() + "/ckpt", 5) +
                          "/model_experts_etp00_ep001_pp000.safetensors");
  test::TempDir out("moe-resume-broken-run");
  const std::string recipe = test::source_dir() + "/recipes/tiny-ramp.yaml";
  auto r = test::run_train(recipe, out.str(), kMoe + "--set checkpoint.load=" + broken.str() + "/ckpt", 1);
  INFO(r.out);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("model_experts_etp00_ep001_pp000.safetensors is missing") != std::string::npos);
}
