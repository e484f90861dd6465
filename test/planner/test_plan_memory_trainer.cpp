// `mtnlg plan --software mtnlg --json` memory per stage against what the trainer actually
// allocates on the CPU (`mtnlg train --memory-report`: every rank's tensor bytes by role,
// counted where Storage is allocated, core/mem_account.hpp), for tiny layouts covering
// tp, pp, dp, ZeRO-1, sequence parallelism, interleaving, the three recompute modes and
// both attention forms (flash: log-sum-exp kept; unfused: probabilities kept, or redone
// under selective recompute):
//  - weights, gradients, optimizer state: equal to the byte (ZeRO-1: the planner gives the
//    largest shard, ceil(P/d); the last dp rank's shard can be smaller);
//  - the activations the chunks keep for their backward (the executor's peak of saved
//    bytes): equal to the byte (the planner walks the same schedule table);
//  - the buffers of pipeline sends not yet waited for (the executor's peak): equal to the
//    byte (the planner walks the same schedule with the same release points);
//  - everything the forward passes allocate (the "activations" role's peak): at least the
//    planner's figure and at most planner + one layer's forward temporaries + the planner's
//    send buffers (the chunk outputs among them are allocated by the forward)
//    (docs/PLANNER.md "Memory: planner against trainer").
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/recipe.hpp"
#include "schedules/pipeline_schedule.hpp"
#include "test/support/test_support.hpp"
#include "test/support/layouts.hpp"

using namespace mtnlg;

namespace {

std::string mpirun(int np) {
  return "sh " + test::source_dir() + "/test/support/mpi/mpirun.sh " + std::to_string(np) + " ";
}

nlohmann::json last_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  REQUIRE(!last.empty());
  return nlohmann::json::parse(last);
}

// What the forward passes allocate beyond what they keep, at most: one layer's forward
// tensors (every tensor layer_forward allocates, as if none were freed: ln1, its gathered
// copy, qkv, att, the projection's partial and reduced outputs, x2, ln2 and its gathered
// copy, fc1, gel, fc2's partial and reduced outputs, y; statistics and log-sum-exp in fp32)
// -- the transient of a full-recompute layer or of the head -- plus the chunk outputs still
// referenced by their nonblocking sends, at most the planner's peak of send buffers
// (app/train/pipeline_executor.cpp waits for each send at its release point).
double transient_bound(const Recipe& r, const nlohmann::json& plan, double send_buffers) {
  const auto& L = plan["layout"];
  const double t = double(L["tp"].get<int64_t>()), b = double(r.training.micro_batch_size);
  const double cp = double(r.cp());
  const double N = b * double(r.model.seq_length) / cp, C = double(r.model.hidden_size), e = 4, w = 4;
  const double f = double(r.model.ffn_hidden_size), a = double(r.model.num_attention_heads),
               V = double(r.model.padded_vocab_size(int64_t(t)));
  const double s = double(r.model.seq_length) / cp;  // a rank's positions of a sequence
  // q/k/v and the attention output (GQA, head size), fc1's output (gate and up under SwiGLU)
  const double qkv = double((r.model.num_attention_heads + 2 * r.model.query_groups()) * r.model.head_dim());
  const double att = double(r.model.num_attention_heads * r.model.head_dim());
  const double pre = r.model.swiglu ? 2 * f : f;
  // the unfused attention form's probabilities and, with dropout, their dropped copy
  const double probs = r.model.attention_backend == AttentionBackend::unfused
                           ? e * b * a / t * s * s * (r.model.attention_dropout > 0 ? 2 : 1)
                           : 0.0;
  const double layer =
      e * (8 * N * C + N * qkv / t + N * att / t + N * (pre + f) / t) + w * (4 * N + b * a / t * s) + probs;
  const double head = e * (3 * N * C + N * V / t) + w * 6 * N;
  // Attention across cp ranks (parallel/context_parallel.cpp): K/V blocks in flight and
  // gathered, partial outputs and log-sum-exps before each merge, or under a2a the whole
  // sequence's q/k/v, output and statistics of this rank's heads.
  const double kvw = 2.0 * double(r.model.query_groups() * r.model.head_dim());
  const double cp_extra =
      cp > 1 ? e * (cp * N * kvw / t + 4 * N * kvw / t + 2 * N * qkv / t + 4 * N * att / t) + w * 4 * b * a / t * s * cp
             : 0.0;
  // An MoE layer's forward (model/moe.cpp): the experts' output rows before they are
  // unpermuted, the gated shared output, beside what it keeps (counted by the plan).
  const auto& moe = r.model.moe;
  const double rows = b * double(r.model.seq_length) * double(moe.moe_router_topk);
  const double moe_extra = moe.enabled() ? e * (rows * C + 2 * N * C) : 0.0;
  return std::max(layer + cp_extra + moe_extra, head) + send_buffers;
}

// Every case: train with the memory report, plan the same recipe and layout, compare rank by
// rank. `model_sets`: --set flags that change the model (for every case). `activations`
// false: compare weights, gradients and optimizer state only (the rows an expert-parallel
// rank receives depend on the routing; the plan takes it as balanced).
void check_layouts(const std::vector<test::Layout>& cases, const std::string& model_sets, bool activations = true) {
  const std::string recipe = test::source_dir() + "/recipes/tiny-ramp.yaml";
  // Iterations 1-2 run the ramp's batch 8, iteration 3 the full batch 16 the planner assumes.
  const std::string common = " --set training.train_iters=3 --set training.num_threads=1" + model_sets;
  for (const auto& c : cases) {
    SECTION(c.name) {
      test::TempDir dir(std::string("mem-") + c.name);
      const std::string sets = std::string(" ") + c.sets + common;
      const std::string train = (c.np > 1 ? mpirun(c.np) : std::string()) + MTNLG_BINARY + " train " + recipe +
                                " --quiet --memory-report" + sets + " --set logging.dir=" + dir.str();
      auto res = test::run_command("timeout -k 5 180 " + train);
      INFO(train << "\n" << res.out);
      REQUIRE(res.exit_code == 0);
      auto plan = test::run_mtnlg(
          fmt::format("plan {} {} --gpus {} --gpu cpu --software mtnlg --json 2>&1", recipe, sets, c.np));
      INFO(plan.out);
      REQUIRE(plan.exit_code == 0);
      const auto pj = nlohmann::json::parse(plan.out);
      // the form the plan counts: the recipe's, auto being flash on the cpu profile
      CHECK(pj["attention_backend"] ==
            (c.sets.find("attention_backend=unfused") != std::string::npos ? "unfused" : "flash"));
      std::vector<std::string> set_list;
      {
        std::istringstream in(sets);
        std::string w;
        while (in >> w)
          if (w != "--set") set_list.push_back(w);
      }
      const Recipe r = load_recipe(recipe, set_list);
      const int64_t cp = pj["layout"]["cp"].get<int64_t>();
      const int64_t dp = c.np / (pj["layout"]["tp"].get<int64_t>() * pj["layout"]["pp"].get<int64_t>() * cp);
      for (int rank = 0; rank < c.np; ++rank) {
        const auto got = last_line(dir.path() / fmt::format("memory_rank{}.jsonl", rank));
        const int64_t st = got["pp_rank"].get<int64_t>();
        const auto& b = pj["stages"][static_cast<size_t>(st)]["breakdown"];
        auto bytes = [&](const char* k) { return b[k].get<double>() * 1073741824.0; };
        INFO("rank " << rank << " stage " << st << ": " << got.dump() << "\nplan: " << b.dump());
        CHECK(double(got["weights"].get<int64_t>()) == bytes("weights_gib"));
        CHECK(double(got["grads"].get<int64_t>()) == bytes("gradients_gib"));
        // ZeRO-1 shards over dp x cp: the first replica's is the largest
        if ((got["dp_rank"].get<int64_t>() == 0 && got["cp_rank"].get<int64_t>() == 0) || dp * cp == 1)
          CHECK(double(got["optimizer"].get<int64_t>()) == bytes("optimizer_gib"));
        else
          CHECK(double(got["optimizer"].get<int64_t>()) <= bytes("optimizer_gib"));
        if (!activations) continue;
        const double planned = bytes("activations_gib");
        CHECK(double(got["saved_activations_peak"].get<int64_t>()) == planned);
        const double sends = bytes("send_buffers_gib");
        CHECK(double(got["send_buffers_peak"].get<int64_t>()) == sends);
        // Sends are waited for during the step: a stage holds the messages of its in-flight
        // window plus one (test/schedules proves the bound), not all m*v chunk outputs and
        // gradients until the step's end.
        const int64_t pp = pj["layout"]["pp"].get<int64_t>(), v = pj["layout"]["virtual_stages"].get<int64_t>();
        if (pp > 1) {
          const int64_t m = r.training.global_batch_size / (r.training.micro_batch_size * dp);
          const double msg = double(r.training.micro_batch_size) * double(r.model.seq_length / cp) *
                             double(r.model.hidden_size) * 4.0 /
                             (pj["layout"]["sequence_parallel"].get<bool>() ? pj["layout"]["tp"].get<double>() : 1.0);
          const auto window = schedules::max_in_flight(schedules::schedule_for(pp, st, m, v));
          CHECK(sends > 0);
          CHECK(sends <= double(window + 1) * msg);
          CHECK(sends < double(m * v) * msg);
        }
        const double all_forward = double(got["activations_peak"].get<int64_t>());
        CHECK(all_forward >= planned);
        CHECK(all_forward <= planned + transient_bound(r, pj, sends));
        WARN(c.name << " rank " << rank << ": forward allocations peak " << all_forward << " B, planned " << planned
                    << " B (+" << fmt::format("{:.1f}", 100 * (all_forward / planned - 1)) << "%)");
      }
    }
  }
}

}  // namespace

TEST_CASE("planner memory per rank equals the trainer's tensor bytes by role", "[e2e][memory]") {
  check_layouts(test::layouts({"single-none", "single-selective", "single-full", "tp2", "pp2", "dp2-zero1",
                               "tp2-pp2-full", "tp2-dp2-sp-selective", "single-unfused", "single-unfused-selective",
                               "tp2-pp2-unfused", "pp4-v2"}),
                "");
}

// Context parallelism: every rank keeps s / cp positions of each sequence (the log-sum-exp
// too), the parameters are whole on every cp rank and ZeRO-1 shards over dp x cp.
TEST_CASE("planner memory per rank equals the trainer's tensor bytes by role: context parallelism", "[e2e][memory]") {
  check_layouts(test::layouts({"cp2", "cp4", "cp2-a2a", "cp4-a2a+p2p", "cp2-tp2-sp", "cp2-pp2", "cp2-pp2-v2-full",
                               "cp2-dp2-zero1"}),
                "");
}

// The same tiny model as the Llama family: rotary positions, RMSNorm (no bias, no mean
// kept), SwiGLU (fc1 2f wide), 4 query heads in 2 key/value groups of head size 16 (the
// attention 64 wide on a residual stream of 32: kv_channels), an output layer of its own
// on the last stage, no linear biases; then with Qwen3's per-head q/k norms (two
// replicated weights of the head size per layer, the qkv before them and their statistics
// kept).
TEST_CASE("planner memory per rank equals the trainer's tensor bytes by role: a Llama-family model", "[e2e][memory]") {
  const std::string llama =
      " --set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true"
      " --set model.ffn_hidden_size=80 --set model.num_query_groups=2 --set model.kv_channels=16"
      " --set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false";
  check_layouts(
      test::layouts({"single-none", "tp2-pp2-full", "tp2-dp2-sp-selective", "single-unfused", "pp4-v2", "dp2-zero1"}),
      llama);
}

// Qwen3's q/k norms on the same model (a test case of its own: a second check_layouts in
// one test case finds its sections, named by layout at the same place, already run).
TEST_CASE("planner memory per rank equals the trainer's tensor bytes by role: q/k head norms", "[e2e][memory]") {
  const std::string llama =
      " --set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true"
      " --set model.ffn_hidden_size=80 --set model.num_query_groups=2 --set model.kv_channels=16"
      " --set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false";
  check_layouts(test::layouts({"single-none", "tp2"}), llama + " --set model.qk_layernorm=true");
}

// A tiny Llama whose every MLP is 4 routed SwiGLU experts of 24, top 2, with the balancing
// and z losses.
const std::string kMoe =
    " --set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true"
    " --set model.ffn_hidden_size=80 --set model.num_query_groups=2"
    " --set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false"
    " --set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=24"
    " --set model.moe_aux_loss_coeff=0.01 --set model.moe_z_loss_coeff=0.001";

// Mixture of experts (one process, as the trainer runs it): every MoE layer keeps the
// router's logits, the top-k weights and experts, the balancing loss's scores and counts,
// the dispatched rows with the experts' fc1 output, activation and weighted activation,
// the row and slot maps, and the shared expert's tensors (model/moe.hpp MoeActs); the
// dense layers between them keep their MLP's.
TEST_CASE("planner memory per rank equals the trainer's tensor bytes by role: mixture of experts", "[e2e][memory]") {
  check_layouts(test::layouts({"single-none", "single-full"}), kMoe);
}

// (A test case of its own: a second check_layouts in one test case finds its sections,
// named by layout at the same place, already run.)
TEST_CASE("planner memory per rank equals the trainer's tensor bytes by role: MoE with a shared expert",
          "[e2e][memory]") {
  check_layouts(test::layouts({"single-none"}),
                kMoe +
                    " --set model.moe_layer_freq=2 --set model.moe_shared_expert_intermediate_size=40"
                    " --set model.moe_shared_expert_gate=true --set model.moe_router_load_balancing_type=seq_aux_loss"
                    " --set training.micro_batch_size=2");
}

// The fp64 router (moe_router_dtype fp64): logits, balancing scores and counts in double,
// the routing weights on the rows fp32.
TEST_CASE("planner memory per rank equals the trainer's tensor bytes by role: MoE with the fp64 router",
          "[e2e][memory]") {
  check_layouts(test::layouts({"single-none"}), kMoe + " --set model.moe_router_dtype=fp64");
}

// Expert parallelism: each rank holds E / ep experts (E / ep of each expert's width over
// etp), the router and the shared expert whole, the experts' optimizer state sharded over
// their own replicas under ZeRO-1, the rest over dp.
TEST_CASE("planner memory per rank equals the trainer's parameter bytes: expert-parallel layouts", "[e2e][memory]") {
  check_layouts(test::layouts({"ep2", "ep2-dp4-zero1", "tp2-sp-ep2", "etp2-ep2-zero1", "pp2-ep2"}),
                kMoe + " --set model.moe_shared_expert_intermediate_size=40", false);
}
