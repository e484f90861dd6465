// `mtnlg plan RECIPE [--gpus N] [--gpu NAME] [--search] [--json] [--svg FILE]`: dry-run
// a layout with the cost model (parallel/cost_model.hpp): per-stage memory, time per
// iteration, throughput, MFU, the whole run's days and GPU-hours; or search all layouts
// of a GPU count and rank them. Output contract: shared/specs/interface.md "Plan".
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "core/error.hpp"
#include "core/recipe.hpp"
#include "parallel/cost_model.hpp"

namespace mtnlg::app {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct PlanArgs {
  std::string recipe;
  std::vector<std::string> sets;
  int64_t gpus = 0;
  std::string gpu = "a100-80g";
  int64_t gpus_per_node = 8;
  int64_t tp = 0, pp = 0, dp = 0;
  bool search = false;
  bool json = false;
  std::string svg;
  int64_t top = 10;
};

nlohmann::json layout_json(const cost::Layout& l) {
  return {{"tp", l.tp},
          {"pp", l.pp},
          {"dp", l.dp},
          {"virtual_stages", l.vp},
          {"micro_batch_size", l.micro_batch},
          {"recompute", to_string(l.recompute)},
          {"sequence_parallel", l.sequence_parallel},
          {"distributed_optimizer", l.distributed_optimizer},
          {"stage_layers", l.stage_layers}};
}

nlohmann::json estimate_json(const cost::Estimate& e, const cost::Cluster& c) {
  nlohmann::json j;
  j["layout"] = layout_json(e.layout);
  j["gpu"] = c.gpu.name;
  j["gpus"] = e.layout.gpus();
  j["iteration_time_s"] = e.iteration_time;
  j["tokens_per_s"] = e.tokens_per_s;
  j["tflops_per_gpu"] = e.tflops_per_gpu;
  j["model_tflops_per_gpu"] = e.model_tflops_per_gpu;
  j["mfu"] = e.mfu;
  j["hfu"] = e.hfu;
  j["bubble_fraction"] = e.bubble_fraction;
  j["microbatches"] = e.microbatches;
  j["peak_memory_gib"] = e.peak_memory / kGiB;
  j["gpu_memory_gib"] = c.gpu.memory_bytes / kGiB;
  j["fits"] = e.fits;
  j["time_breakdown_s"] = {{"pipeline", e.pipeline_time}, {"data_parallel", e.dp_time}, {"optimizer", e.optimizer_time}};
  j["comm_bytes_per_iteration"] = {{"tp", e.comm.tp}, {"pp", e.comm.pp}, {"dp", e.comm.dp}};
  j["run"] = {{"iterations", e.run_iterations},
              {"tokens", e.run_tokens},
              {"seconds", e.run_seconds},
              {"days", e.run_seconds / 86400.0},
              {"gpu_hours", e.run_gpu_hours},
              {"average_tokens_per_s", e.run_tokens_per_s}};
  nlohmann::json stages = nlohmann::json::array();
  for (size_t i = 0; i < e.stages.size(); ++i) {
    const auto& m = e.stages[i];
    const auto& t = e.stage_times[i];
    stages.push_back({{"stage", m.stage},
                      {"layers", m.layers},
                      {"params", m.params},
                      {"memory_gib", m.total / kGiB},
                      {"breakdown",
                       {{"weights_gib", m.weights / kGiB},
                        {"gradients_gib", m.gradients / kGiB},
                        {"optimizer_gib", m.optimizer / kGiB},
                        {"activations_gib", m.activations / kGiB},
                        {"embedding_gib", m.embedding / kGiB},
                        {"logits_gib", m.logits / kGiB},
                        {"comm_buffers_gib", m.comm_buffers / kGiB},
                        {"workspace_gib", m.workspace / kGiB}}},
                      {"forward_s", t.forward},
                      {"backward_s", t.backward},
                      {"tp_comm_s", t.tp_comm},
                      {"p2p_s", t.p2p}});
  }
  j["stages"] = stages;
  return j;
}

void print_human(const Recipe& r, const cost::Estimate& e, const cost::Cluster& c) {
  std::printf("plan: %s on %lld x %s (%lld per node)\n", r.name.c_str(), static_cast<long long>(e.layout.gpus()),
              c.gpu.name.c_str(), static_cast<long long>(c.gpus_per_node));
  std::printf("layout: %s, %lld microbatches per iteration\n", e.layout.describe().c_str(),
              static_cast<long long>(e.microbatches));
  std::printf("\n%6s %6s %10s %10s %10s %10s %10s %10s %10s %10s\n", "stage", "layers", "total GiB", "weights", "grads",
              "optim", "activ", "emb+logit", "buffers", "workspace");
  for (auto& m : e.stages)
    std::printf("%6lld %6lld %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", static_cast<long long>(m.stage),
                static_cast<long long>(m.layers), m.total / kGiB, m.weights / kGiB, m.gradients / kGiB,
                m.optimizer / kGiB, m.activations / kGiB, (m.embedding + m.logits) / kGiB, m.comm_buffers / kGiB,
                m.workspace / kGiB);
  std::printf("\npeak memory      %.2f GiB of %.2f GiB: %s\n", e.peak_memory / kGiB, c.gpu.memory_bytes / kGiB,
              e.fits ? "fits" : "DOES NOT FIT");
  std::printf("iteration time   %.3f s (pipeline %.3f, data-parallel reduce %.3f, optimizer %.3f)\n", e.iteration_time,
              e.pipeline_time, e.dp_time, e.optimizer_time);
  std::printf("bubble           %.1f%% of the pipeline phase\n", 100.0 * e.bubble_fraction);
  std::printf("throughput       %.0f tokens/s\n", e.tokens_per_s);
  std::printf("TFLOP/s per GPU  %.1f hardware (Megatron convention%s), %.1f model (72-form)\n", e.tflops_per_gpu,
              e.layout.recompute == RecomputeGranularity::full ? ", 96-form under full recompute" : "",
              e.model_tflops_per_gpu);
  std::printf("MFU              %.1f%% (HFU %.1f%%) of %.0f TFLOP/s peak\n", 100 * e.mfu, 100 * e.hfu,
              c.gpu.peak_flops / 1e12);
  std::printf("comm per rank    tp %.2f GB, pp %.2f GB, dp %.2f GB sent per iteration\n", e.comm.tp / 1e9, e.comm.pp / 1e9,
              e.comm.dp / 1e9);
  if (e.run_iterations > 0)
    std::printf("whole run        %lld iterations, %.3g tokens, %.1f days, %.3g GPU-hours (%.0f tokens/s average, ramp "
                "included)\n",
                static_cast<long long>(e.run_iterations), e.run_tokens, e.run_seconds / 86400.0, e.run_gpu_hours,
                e.run_tokens_per_s);
}

void write_svg(const cost::Estimate& e, const std::string& path, const std::string& name) {
  const auto& l = e.layout;
  std::vector<double> f, b;
  double p2p_total = 0;
  for (auto& t : e.stage_times) {
    f.push_back(t.forward / double(l.vp));
    b.push_back(t.backward / double(l.vp));
    p2p_total = std::max(p2p_total, t.p2p);
  }
  const double p2p_one = l.pp > 1 ? p2p_total / (2.0 * double(l.vp)) : 0;
  auto ops = cost::simulate_pipeline(l.pp, e.microbatches, l.vp, f, b, p2p_one);
  std::string title = fmt::format("{}: {} ({}), {} microbatches, pipeline {:.2f} s, bubble {:.1f}%", name, l.describe(),
                                  l.vp > 1 ? "interleaved 1F1B" : "1F1B", e.microbatches, cost::makespan(ops),
                                  100.0 * e.bubble_fraction);
  std::string svg = cost::timeline_svg(ops, l.pp, title);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw_input("--svg {}: cannot write this file", path);
    out << svg;
    if (!out.flush()) throw_runtime("--svg {}: write failed", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw_runtime("--svg {}: cannot rename {} into place", path, tmp);
}

void run_plan(const PlanArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (a.tp > 0) sets.push_back(fmt::format("parallel.tensor_model_parallel_size={}", a.tp));
  if (a.pp > 0) sets.push_back(fmt::format("parallel.pipeline_model_parallel_size={}", a.pp));
  Recipe r = load_recipe(a.recipe, sets);
  cost::Cluster c{cost::gpu_spec(a.gpu), a.gpus_per_node};
  if (a.gpus_per_node < 1) throw_input("--gpus-per-node {}: must be at least 1", a.gpus_per_node);
  int64_t gpus = a.gpus;
  if (a.dp > 0) {
    if (gpus > 0 && gpus != r.tp() * r.pp() * a.dp)
      throw_input("--gpus {} does not equal tp x pp x dp = {} x {} x {}", gpus, r.tp(), r.pp(), a.dp);
    gpus = r.tp() * r.pp() * a.dp;
  }
  if (gpus <= 0) gpus = r.tp() * r.pp();  // no --gpus: one model replica
  cost::Estimate est;
  nlohmann::json search_json;
  if (a.search) {
    auto res = cost::search(r, gpus, c, static_cast<size_t>(std::max<int64_t>(1, a.top)));
    if (res.best.empty()) {
      std::string why;
      for (auto& [k, v] : res.rejected) why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", k, v);
      throw_input("{}: no layout of {} GPUs ({}) fits; {} layouts rejected ({})", a.recipe, gpus, c.gpu.name,
                  res.considered, why);
    }
    est = cost::estimate(r, res.best.front().layout, c);
    search_json["considered"] = res.considered;
    search_json["feasible"] = res.feasible;
    search_json["rejected"] = res.rejected;
    nlohmann::json ranked = nlohmann::json::array();
    for (auto& e : res.best)
      ranked.push_back({{"layout", layout_json(e.layout)},
                        {"iteration_time_s", e.iteration_time},
                        {"tokens_per_s", e.tokens_per_s},
                        {"tflops_per_gpu", e.tflops_per_gpu},
                        {"mfu", e.mfu},
                        {"peak_memory_gib", e.peak_memory / kGiB}});
    search_json["ranked"] = ranked;
    if (!a.json) {
      std::printf("search: %lld layouts of %lld GPUs considered, %lld feasible\n", static_cast<long long>(res.considered),
                  static_cast<long long>(gpus), static_cast<long long>(res.feasible));
      std::printf("%4s %-62s %12s %10s %8s %8s\n", "rank", "layout", "tokens/s", "iter s", "MFU", "mem GiB");
      int i = 1;
      for (auto& e : res.best)
        std::printf("%4d %-62s %12.0f %10.3f %7.1f%% %8.1f\n", i++, e.layout.describe().c_str(), e.tokens_per_s,
                    e.iteration_time, 100 * e.mfu, e.peak_memory / kGiB);
      std::printf("rejected:\n");
      for (auto& [k, v] : res.rejected) std::printf("  %8lld  %s\n", static_cast<long long>(v), k.c_str());
      std::printf("\nbest layout in detail:\n");
    }
  } else {
    cost::Layout l = cost::layout_from_recipe(r, gpus);
    est = cost::estimate(r, l, c);
  }
  const std::string ramp_note = cost::ramp_problem(r, est.layout);
  if (a.json) {
    nlohmann::json j = estimate_json(est, c);
    j["warnings"] = nlohmann::json::array();
    if (!ramp_note.empty())
      j["warnings"].push_back(ramp_note + " (mtnlg train would reject this; ramp microbatches are rounded up here)");
    j["recipe"] = r.name;
    if (a.search) j["search"] = search_json;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_human(r, est, c);
    if (!ramp_note.empty())
      std::printf("warning          %s (mtnlg train would reject this; ramp microbatches are rounded up here)\n",
                  ramp_note.c_str());
  }
  if (!a.svg.empty()) write_svg(est, a.svg, r.name);
}

}  // namespace

void register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Predict memory and throughput of a layout, or search for the best one");
  static PlanArgs a;
  cmd->add_option("recipe", a.recipe, "Recipe YAML file")->required();
  cmd->add_option("--set", a.sets, "Override a recipe key: section.key=value (e.g. parallel.tensor_model_parallel_size=4); repeatable");
  cmd->add_option("--gpus", a.gpus, "Number of GPUs (world size); default tp x pp (x --dp)");
  cmd->add_option("--gpu", a.gpu, "GPU kind: a100-80g, h100-80g or h200-141g")->capture_default_str();
  cmd->add_option("--gpus-per-node", a.gpus_per_node, "GPUs per node (NVLink domain)")->capture_default_str();
  cmd->add_option("--tp", a.tp, "Override parallel.tensor_model_parallel_size");
  cmd->add_option("--pp", a.pp, "Override parallel.pipeline_model_parallel_size");
  cmd->add_option("--dp", a.dp, "Data-parallel size (sets --gpus to tp x pp x dp)");
  cmd->add_flag("--search", a.search, "Enumerate all layouts of --gpus GPUs and rank the feasible ones by throughput");
  cmd->add_option("--top", a.top, "With --search: how many ranked layouts to show")->capture_default_str();
  cmd->add_flag("--json", a.json, "Print one JSON object (interface.md \"Plan\") instead of tables");
  cmd->add_option("--svg", a.svg, "Write the pipeline timeline of the (chosen) layout as SVG to this file");
  cmd->callback([] { run_plan(a); });
}

}  // namespace mtnlg::app
