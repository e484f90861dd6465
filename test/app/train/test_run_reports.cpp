// The run's report files (app/train/run_reports.hpp): metrics.jsonl's line per logged
// iteration with the fields readers depend on (the GPU-only ones only on a GPU run), and
// the per-rank memory and communication reports.
#include <catch2/catch.hpp>

#include <memory>
#include <nlohmann/json.hpp>

#include "app/train/run_reports.hpp"
#include "test/support/process_groups.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;

namespace {
nlohmann::json only_line(const std::filesystem::path& p) {
  const std::string text = test::read_file(p);
  REQUIRE(std::count(text.begin(), text.end(), '\n') == 1);
  return nlohmann::json::parse(text);
}
}  // namespace

TEST_CASE("run reports: metrics.jsonl, memory_rank0.jsonl and bytes_rank0.jsonl lines", "[reports]") {
  test::TempDir d("run-reports");
  Recipe r;
  app::IterationStats s;
  s.iteration = 7;
  s.loss = 2.5;
  s.tokens_per_s = 1234;
  s.mem_weights = 4096;
  {
    app::MetricsWriter cpu(d.str() + "/cpu", true, parallel::Topology{1, 1, 1});
    cpu.write(s, r, 1.0);
    s.gemm_fallbacks = 3;  // a CUDA run's counter
    app::MetricsWriter gpu(d.str() + "/gpu", true, parallel::Topology{1, 1, 1});
    gpu.write(s, r, 1.0);
    app::MetricsWriter off(d.str() + "/off", false, parallel::Topology{1, 1, 1});  // not rank 0
    off.write(s, r, 1.0);
  }
  const nlohmann::json c = only_line(d.path() / "cpu" / "metrics.jsonl"),
                       g = only_line(d.path() / "gpu" / "metrics.jsonl");
  CHECK(c["iteration"] == 7);
  CHECK(c["loss"] == 2.5);
  CHECK(c["tokens_per_s"] == 1234.0);
  CHECK_FALSE(c.contains("gemm_fallbacks"));
  CHECK_FALSE(c.contains("loss_scale"));  // fp16 only
  CHECK(g["gemm_fallbacks"] == 3);
  CHECK_FALSE(std::filesystem::exists(d.path() / "off" / "metrics.jsonl"));

  const parallel::ProcessGroups groups = test::single_process_groups();
  app::MemoryReport mem(d.str(), groups, true);
  mem.write(s);
  CHECK(only_line(d.path() / "memory_rank0.jsonl")["weights"] == 4096);
  app::CommReport comm(d.str(), groups, true);
  comm.reset();
  comm.write(7, 8, 2, 3, 1);
  const nlohmann::json b = only_line(d.path() / "bytes_rank0.jsonl");
  CHECK(b["micro_batches"] == 2);
  CHECK(b["dp_buckets_started_early"] == 1);
  CHECK(b["dp"] == 0);  // a group of one sends nothing
}

// The train banner names the architecture family with its switches and the FLOP formula the
// log line's TFLOP/s and MFU count (model/flops.hpp): the 72-form for the GPT, Megatron-Core's
// count with the GQA and SwiGLU terms for the Llama family.
TEST_CASE("train banner: the family with its switches and the FLOP formula", "[e2e][reports]") {
  test::TempDir d("banner");
  const std::string common = "train " + test::source_dir() +
                             "/recipes/tiny-ramp.yaml --set training.train_iters=1 --set training.num_threads=1";
  auto gpt = test::run_mtnlg(common + " --set logging.dir=" + (d.path() / "gpt").string() + " 2>&1");
  INFO(gpt.out);
  REQUIRE(gpt.exit_code == 0);
  CHECK(gpt.out.find("architecture: gpt: learned positions, LayerNorm, GELU, ffn 128, tied\n") != std::string::npos);
  CHECK(gpt.out.find("model FLOPs 72*B*s*l*h^2*(1+s/(6h)+V/(12*l*h)) per iteration") != std::string::npos);
  auto llama =
      test::run_mtnlg(common +
                      " --set model.position_embedding_type=rope --set model.rotary_base=500000"
                      " --set model.normalization=RMSNorm --set model.swiglu=true --set model.ffn_hidden_size=80"
                      " --set model.num_query_groups=2 --set model.untie_embeddings_and_output_weights=true"
                      " --set model.add_bias_linear=false --set logging.dir=" +
                      (d.path() / "llama").string() + " 2>&1");
  INFO(llama.out);
  REQUIRE(llama.exit_code == 0);
  CHECK(llama.out.find("architecture: llama: rope base 500000, RMSNorm, SwiGLU, ffn 80, 2 query groups, untied, no "
                       "linear biases\n") != std::string::npos);
  CHECK(llama.out.find("model FLOPs 12*B*s*l*h^2*((1+G/H+s/h)*H*D/h+3/2*F/h+V/(2*l*h)) with H 4, G 2, D 8, F 80 per "
                       "iteration") != std::string::npos);
}

TEST_CASE("run reports: an MoE step's log part and TensorBoard scalars", "[reports]") {
  app::IterationStats s;
  CHECK(app::moe_log_part(s, false).empty());  // dense
  CHECK(app::moe_tensorboard_scalars(s, true).empty());
  s.moe = true;
  s.moe_aux_loss = 1.25;
  s.moe_z_loss = 3.5;
  for (int64_t layer : {1, 3, 11}) {
    app::IterationStats::MoeLayerLoad l;
    l.layer = layer;
    l.tokens = {10, 20, 30, 40};
    l.min_over_mean = layer == 3 ? 0.1 : 0.4;
    l.max_over_mean = layer == 11 ? 3.5 : 1.6;
    l.dropped = layer;
    s.moe_layers.push_back(l);
  }
  CHECK(app::moe_log_part(s, false) ==
        " | load balancing loss: 1.250000E+00 | z loss: 3.500000E+00 | expert load max/mean: 3.50 (layer 11), "
        "min/mean: 0.10 (layer 3)");
  CHECK(app::moe_log_part(s, true).ends_with("min/mean: 0.10 (layer 3) | dropped slots: 15"));
  auto tb = app::moe_tensorboard_scalars(s, false);
  CHECK(tb.size() == 2 + 3 * 2);
  CHECK(tb.at("load_balancing_loss") == 1.25);
  CHECK(tb.at("z_loss") == 3.5);
  CHECK(tb.at("layer03/min_over_mean") == 0.1);  // padded to the widest layer index
  CHECK(tb.at("layer11/max_over_mean") == 3.5);
  CHECK(tb.count("layer01/dropped") == 0);
  tb = app::moe_tensorboard_scalars(s, true);
  CHECK(tb.at("layer01/dropped") == 1);
  s.moe_aux_loss = -1;  // balancing off
  s.moe_z_loss = -1;
  CHECK(app::moe_tensorboard_scalars(s, false).count("load_balancing_loss") == 0);
  CHECK(app::moe_log_part(s, false).starts_with(" | expert load max/mean: 3.50 (layer 11)"));
}
