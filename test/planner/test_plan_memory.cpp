// The planner's per-GPU parameter count (hence its weight, gradient and optimizer bytes:
// fp32 on the CPU holds 4 + 4 + 8 bytes per parameter on both sides) equals what the
// trainer declares, for every layout the multi-rank tests train (test_parallel_proofs,
// test_train_layouts). The trainer's rank-local parameters come from the same call it
// makes (model::declare_chunk_params per pipeline rank and chunk).
// What the trainer actually allocates (activations included) is compared per rank in
// test_plan_memory_trainer.cpp (`train --memory-report`, docs/PLANNER.md).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "app/process/module_configs.hpp"
#include "config/recipe.hpp"
#include "model/gpt.hpp"
#include "model/params.hpp"
#include "planner/cost_model.hpp"

using namespace mtnlg;

namespace {

// What one GPU of pipeline rank `st` holds: the trainer's declaration, chunk by chunk.
int64_t trainer_params(const Recipe& r, const cost::Layout& l, int64_t st) {
  model::GptConfig cfg = app::gpt_config(r);
  model::ParamStore store;
  const int64_t per_chunk = l.stage_layers[static_cast<size_t>(st)] / l.vp;
  int64_t first = 0;
  for (int64_t i = 0; i < st; ++i) first += l.stage_layers[static_cast<size_t>(i)] / l.vp;
  for (int64_t c = 0; c < l.vp; ++c) {
    model::ChunkSpec s;
    s.first_layer = first + c * (r.model.num_layers / l.vp);
    s.num_layers = per_chunk;
    s.has_embedding = st == 0 && c == 0;
    s.has_head = st == l.pp - 1 && c == l.vp - 1;
    s.prefix = l.vp > 1 ? fmt::format("chunk{}.", c) : "";
    model::declare_chunk_params(store, cfg, s, 0, l.tp);
  }
  store.finalize(DType::f32);
  return store.numel();
}

}  // namespace

TEST_CASE("planner parameter memory equals the trainer's declaration for the tested layouts", "[cost]") {
  struct Case {
    int64_t tp, pp, dp, layers_per_virtual;
    bool sp, zero1;
    const char* recompute;
  } cases[] = {{1, 1, 1, 0, false, false, "none"}, {2, 1, 1, 0, false, false, "none"},
               {1, 2, 1, 0, false, false, "none"}, {1, 1, 2, 0, false, false, "none"},
               {2, 2, 2, 0, false, false, "none"}, {2, 2, 2, 0, false, true, "none"},
               {2, 1, 2, 0, true, false, "none"},  {1, 4, 1, 1, false, false, "none"},
               {2, 2, 1, 0, false, false, "full"}, {1, 4, 1, 0, false, false, "selective"}};
  for (auto& c : cases) {
    const std::string y = fmt::format(
        "model: {{num_layers: 8, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 500, "
        "make_vocab_size_divisible_by: 8}}\n"
        "parallel: {{tensor_model_parallel_size: {}, pipeline_model_parallel_size: {}, "
        "num_layers_per_virtual_pipeline_stage: {}, sequence_parallel: {}, use_distributed_optimizer: {}, "
        "recompute_granularity: {}}}\n"
        "training: {{precision: fp32, micro_batch_size: 1, global_batch_size: 8, train_iters: 2}}\n"
        "data: {{mock: true}}\n",
        c.tp, c.pp, c.layers_per_virtual, c.sp ? "true" : "false", c.zero1 ? "true" : "false", c.recompute);
    Recipe r = parse_recipe(y, "memory-test");
    const cost::Layout l = cost::layout_from_recipe(r, c.tp * c.pp * c.dp);
    const cost::Estimate e = cost::estimate(r, l, cost::Cluster{cost::gpu_spec("cpu"), 8}, {false});
    for (int64_t st = 0; st < l.pp; ++st) {
      const auto& m = e.stages[static_cast<size_t>(st)];
      const double declared = double(trainer_params(r, l, st));
      INFO(l.describe() << " stage " << st);
      CHECK(m.params == Approx(declared).epsilon(1e-12));
      // fp32 on the CPU: weights 4, gradients 4, Adam m + v 8 bytes per parameter (÷ dp under ZeRO-1).
      CHECK(m.weights == Approx(4 * declared));
      CHECK(m.gradients == Approx(4 * declared));
      CHECK(m.optimizer == Approx(8 * declared / (c.zero1 ? double(c.dp) : 1.0)));
    }
  }
}

// The allocator's peak that mtnlg measured on one H200 (bf16, unfused attention, CUDA
// 13.0), against the planner's allocator peak for the same recipe: the caching allocator
// holds the tensors, the p2p buffers, the layer a full recompute re-materializes and the
// cuBLAS workspace; the CUDA context, NCCL's buffers and fragmentation are outside it (and
// in the plan's total, which is what must fit). Bound: 10%; the figures agree to 0.1%.
TEST_CASE("planner allocator peak against the allocator peaks measured on an H200", "[cost]") {
  struct Run {
    const char* what;
    std::vector<std::string> sets;
    double measured_gib;
  } runs[] = {
      // scripts/gpu/train-proof.sh's mem13b step (its log line: 22.73 GiB)
      {"GPT 1.3B, micro batch 1, full recompute",
       {"training.micro_batch_size=1", "training.global_batch_size=4", "parallel.recompute_granularity=full"},
       22.73},
      // scripts/bench/gpu_bench.sh's 1.3B row: metrics.jsonl peak_memory_bytes 37060476928
      {"GPT 1.3B, micro batch 2, no recompute",
       {"training.micro_batch_size=2", "training.global_batch_size=2", "parallel.recompute_granularity=none",
        "model.attention_backend=unfused", "model.hidden_dropout=0.0", "model.attention_dropout=0.0"},
       37060476928.0 / (1024.0 * 1024.0 * 1024.0)},
  };
  for (const Run& run : runs) {
    const Recipe r = load_recipe(std::string(MTNLG_SOURCE_DIR) + "/recipes/gpt-1.3b.yaml", run.sets);
    const cost::Cluster c{cost::gpu_spec("h100-80g"), 8, cost::software_profile("mtnlg")};
    const cost::Estimate e = cost::estimate(r, cost::layout_from_recipe(r, 1), c);
    const double plan = e.allocator_peak / (1024.0 * 1024.0 * 1024.0);
    INFO(run.what << ": measured " << run.measured_gib << " GiB, planned allocator peak " << plan << " GiB, total "
                  << e.peak_memory / (1024.0 * 1024.0 * 1024.0) << " GiB");
    CHECK(std::fabs(plan - run.measured_gib) <= 0.10 * run.measured_gib);
    CHECK(e.peak_memory > e.allocator_peak);  // the total adds the context and fragmentation
  }
}
