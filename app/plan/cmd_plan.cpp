// `mtnlg plan RECIPE [--gpus N] [--gpu NAME] [--search] [--json] [--svg FILE]`: dry-run
// a layout with the cost model (planner/cost_model.hpp): per-stage memory, time per
// iteration, throughput, MFU, the whole run's days and GPU-hours; or search all layouts
// of a GPU count and rank them. Output contract: docs/specs/interface.md "Plan".
// `--sbatch FILE` also writes a Slurm batch script that runs the chosen layout, modelled
// on scripts/slurm/mtnlg-530b.sbatch (srun + PMIx, USR1 before the time limit, requeue
// on exit 75, MTNLG_DRY_RUN); docs/SLURM.md describes what it relies on.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/commands.hpp"
#include "planner/gpu_profile.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "config/recipe.hpp"
#include "model/flops.hpp"
#include "planner/cost_model.hpp"

#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/cudnn_attention.hpp"
#include "core/cuda/cudnn_device.hpp"
#endif

namespace mtnlg::app {

namespace {

// Whether the installed cuDNN plans the recipe's flash attention (forward and backward at
// the layout's micro batch and tensor-parallel heads) for the target GPU, asked without a
// GPU (cuDNN >= 9.8's offline planning, core/cuda/cudnn_device.hpp), and the device bytes
// a call takes beside its tensors.
struct CudnnCheck {
  bool asked = false;  // the plan counts cuDNN's flash form on a GPU
  bool planned = false;
  std::string library, why;
  int64_t forward_workspace = 0, backward_workspace = 0, dq_accumulator = 0;
  double bytes() const { return double(std::max(forward_workspace, backward_workspace + dq_accumulator)); }
};

CudnnCheck check_cudnn(const Recipe& r, const cost::Layout& l, const cost::Cluster& c) {
  CudnnCheck k;
  if (!c.software.trainer_activations || cost::trainer_unfused_attention(r, c) || c.gpu.name.rfind("cpu", 0) == 0)
    return k;
  k.asked = true;
#ifndef MTNLG_HAVE_CUDA
  k.why = "this mtnlg was built without CUDA";
  (void)l;
#else
  k.library = cuda::cudnn_description("installed");
  const std::string key = c.gpu.name.substr(0, c.gpu.name.find('-'));
  const cuda::CudnnDevice* dev = cuda::cudnn_device(key);
  if (!dev) {
    k.why = fmt::format("no device description of {} to plan for (core/cuda/cudnn_device.cpp: h100, h200)", c.gpu.name);
    return k;
  }
  if (const std::string e = cuda::load_plan_driver(cuda::plan_driver_beside_executable()); !e.empty()) {
    k.why = e;
    return k;
  }
  cuda::SdpaGraph g;
  g.dt = r.training.precision == Precision::fp16 ? DType::f16 : DType::bf16;
  g.B = l.micro_batch;
  g.T = r.model.seq_length;
  g.H = r.model.num_attention_heads / l.tp;
  g.G = r.model.query_groups() / l.tp;
  g.D = r.model.head_dim();
  g.dropout_p = r.model.attention_dropout;
  g.deterministic = r.training.deterministic_mode;
  const std::string json = cuda::cudnn_device_json(*dev);
  const cuda::SdpaPlan f = cuda::plan_offline(g, json, "installed");
  g.forward = false;
  const cuda::SdpaPlan b = f.planned ? cuda::plan_offline(g, json, "installed") : cuda::SdpaPlan{};
  k.planned = f.planned && b.planned;
  k.why = !f.planned ? f.why : b.why;
  k.forward_workspace = f.workspace;
  k.backward_workspace = b.workspace;
  k.dq_accumulator = b.accumulator;
#endif
  return k;
}

nlohmann::json cudnn_json(const CudnnCheck& k) {
  if (!k.asked) return nullptr;
  nlohmann::json j{{"library", k.library}, {"planned", k.planned}};
  if (k.planned) {
    j["forward_workspace_bytes"] = k.forward_workspace;
    j["backward_workspace_bytes"] = k.backward_workspace;
    j["dq_accumulator_bytes"] = k.dq_accumulator;
  } else {
    j["why"] = k.why;
  }
  return j;
}

void print_cudnn(const CudnnCheck& k, const Recipe& r, const cost::Layout& l, const cost::Cluster& c) {
  if (!k.asked) return;
  const std::string what = fmt::format("micro batch {}, {} heads of {} per GPU, sequence {}", l.micro_batch,
                                       r.model.num_attention_heads / l.tp, r.model.head_dim(), r.model.seq_length);
  if (k.planned) {
    const std::string acc = k.dq_accumulator > 0
                                ? fmt::format(" + {:.2f} MiB fp32 dQ accumulator", double(k.dq_accumulator) / (1 << 20))
                                : std::string(" (deterministic)");
    fmt::print(
        "cuDNN attention  {} plans it for {} ({}): forward workspace {} B, backward {:.2f} MiB{}, counted in the "
        "workspace\n",
        k.library, c.gpu.name, what, k.forward_workspace, double(k.backward_workspace) / (1 << 20), acc);
  } else {
    fmt::print(
        "cuDNN attention  not planned for {} ({}): {}; with model.attention_backend auto the trainer would run "
        "the unfused form\n",
        c.gpu.name, what, k.why);
  }
}

// Writes one plan output atomically. A file that cannot be created is the user's input
// (exit 2); a failure while writing is a fault (exit 1). Both name the option.
void write_plan_output(const std::string& key, const std::string& path, const std::string& text,
                       bool executable = false) {
  std::optional<AtomicFile> f;
  try {
    f.emplace(path);
  } catch (const RuntimeError& e) {
    throw_input("{} {}", key, e.what());
  }
  try {
    f->write(text);
    if (executable)
      std::filesystem::permissions(f->temp_path(),
                                   std::filesystem::perms::owner_exec | std::filesystem::perms::group_exec,
                                   std::filesystem::perm_options::add);
    f->commit();
  } catch (const RuntimeError& e) {
    throw_runtime("{} {}", key, e.what());
  }
}

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
  std::string sbatch;
  int64_t top = 10;
  std::string software = "megatron-lm";
  std::string gpu_profile;             // --gpu-profile FILE (written by --calibrate)
  std::vector<std::string> calibrate;  // --calibrate RUN_DIR (repeatable)
  std::string profile_out;             // --profile-out FILE (default RUN_DIR/gpu-profile.json)
  std::string step_stat = "median";    // --step-stat median|min: a run's step time from its iterations
};

// The measured seconds per iteration of a run: the median step_time_s of metrics.jsonl's
// records at the recipe's full global batch, the first logged record left out (start-up)
// when there are at least three.
// With stat "min" the fastest such iteration instead: on a shared machine other processes
// only ever slow an iteration down, so the least disturbed one is the best estimate.
double measured_step_time(const std::string& run_dir, int64_t global_batch, const std::string& stat = "median") {
  const std::string path = run_dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) throw_input("--calibrate {}: no metrics.jsonl ({})", run_dir, path);
  std::vector<double> all, full;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw_input("--calibrate {}: line {} is not JSON", path, n);
    }
    if (!j.contains("step_time_s") || !j["step_time_s"].is_number()) continue;
    const double t = j["step_time_s"].get<double>();
    if (!(t > 0)) continue;
    all.push_back(t);
    if (j.value("global_batch_size", int64_t{0}) == global_batch) full.push_back(t);
  }
  std::vector<double>& v = full.empty() ? all : full;
  if (v.empty()) throw_input("--calibrate {}: no step_time_s in {}", run_dir, path);
  if (v.size() >= 3) v.erase(v.begin());
  std::sort(v.begin(), v.end());
  if (stat == "min") return v.front();
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// world_size of the first metrics.jsonl record that has it (the trainer writes it every
// iteration), 0 when none does.
int64_t recorded_world_size(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("world_size") && j["world_size"].is_number_integer()) return j["world_size"].get<int64_t>();
    } catch (const std::exception&) {
      return 0;  // measured_step_time reports the bad line
    }
  }
  return 0;
}

// `--calibrate BENCH.json` (scripts/bench/gpu_gemm_attn.py, format mtnlg-gpu-bench/1): fits the
// GEMM curve and the fused-attention rates of the base GPU to measured kernels and writes a
// profile (docs/PLANNER.md "GEMM curve and attention rates").
constexpr const char* kBenchFormat = "mtnlg-gpu-bench/1";

void run_calibrate_kernels(const PlanArgs& a, const cost::GpuSpec& base) {
  const std::string& path = a.calibrate.front();
  std::ifstream in(path);
  if (!in) throw_input("--calibrate {}: cannot open", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw_input("--calibrate {}: not JSON ({})", path, e.what());
  }
  if (!j.is_object() || j.value("format", "") != kBenchFormat)
    throw_input("--calibrate {}: not a kernel benchmark (\"format\": \"{}\" missing; a run directory is a directory)",
                path, kBenchFormat);
  std::vector<cost::GemmSample> gemms;
  std::vector<cost::AttentionSample> attn;
  try {
    for (auto& x : j.value("gemm", nlohmann::json::array()))
      gemms.push_back({x.at("m").get<int64_t>(), x.at("n").get<int64_t>(), x.at("k").get<int64_t>(),
                       x.value("batch", int64_t{1}), x.at("seconds").get<double>()});
    for (auto& x : j.value("attention", nlohmann::json::array()))
      attn.push_back({x.at("batch").get<int64_t>() * x.at("heads").get<int64_t>(), x.at("seq").get<int64_t>(),
                      x.at("head_dim").get<int64_t>(), x.at("fwd_seconds").get<double>(),
                      x.at("bwd_seconds").get<double>()});
  } catch (const nlohmann::json::exception& e) {
    throw_input("--calibrate {}: bad sample ({})", path, e.what());
  }
  const cost::KernelFit fit = cost::calibrate_kernels(base, gemms, attn);
  const std::string out = a.profile_out.empty() ? path + ".gpu-profile.json" : a.profile_out;
  nlohmann::json pj = cost::gpu_profile_json(fit.gpu);
  pj["name"] = base.name + "-calibrated";
  pj["description"] = fmt::format("{} with the GEMM curve and attention rates measured on {} ({})", base.name,
                                  j.value("device", std::string("?")), path);
  pj["calibration"] = {{"base", base.name},
                       {"bench_file", path},
                       {"device", j.value("device", std::string("?"))},
                       {"gemms", gemms.size()},
                       {"gemm_rms_relative_error", fit.gemm_rms},
                       {"attention_shapes", attn.size()},
                       {"attention_rms_relative_error", fit.attention_rms},
                       {"attention_backend", j.value("attention_backend", std::string("?"))}};
  write_plan_output("--profile-out", out, pj.dump(2) + "\n");
  if (a.json) {
    pj["profile_file"] = out;
    std::printf("%s\n", pj.dump(2).c_str());
    return;
  }
  const cost::GpuSpec& g = fit.gpu;
  std::printf("calibrate: %zu GEMM(s), %zu attention shape(s) from %s (%s) against %s\n", gemms.size(), attn.size(),
              path.c_str(), j.value("device", std::string("?")).c_str(), base.name.c_str());
  if (!gemms.empty())
    std::printf(
        "GEMM curve: efficiency %.3g x wave x K/(K+%.0f), kernel overhead %.3g us; 8192^3 at %.0f TFLOP/s; "
        "residual %.2f%% rms\n",
        g.gemm_eff_max, g.gemm_k_half, g.kernel_overhead * 1e6,
        2.0 * 8192.0 * 8192.0 * 8192.0 / cost::gemm_seconds(g, 8192, 8192, 8192) / 1e12, 100 * fit.gemm_rms);
  if (!attn.empty())
    std::printf(
        "attention: forward %.0f, backward %.0f TFLOP/s (head dim 128, long sequences; half-points s %.0f, d %.0f); "
        "residual %.2f%% rms\n",
        g.attn_fwd_flops / 1e12, g.attn_bwd_flops / 1e12, g.attn_seq_half, g.attn_dim_half, 100 * fit.attention_rms);
  std::printf("wrote %s (use: mtnlg plan RECIPE --gpu-profile %s)\n", out.c_str(), out.c_str());
}

void run_calibrate(const PlanArgs& a) {
  namespace fs = std::filesystem;
  const cost::GpuSpec base = a.gpu_profile.empty() ? cost::gpu_spec(a.gpu) : cost::load_gpu_profile(a.gpu_profile);
  if (a.calibrate.size() == 1 && fs::is_regular_file(a.calibrate.front())) return run_calibrate_kernels(a, base);
  std::vector<cost::Observation> runs;
  for (auto& dir : a.calibrate) {
    const std::string rp = dir + "/recipe.resolved.yaml";
    if (!fs::exists(rp)) throw_input("--calibrate {}: no recipe.resolved.yaml (is it a run directory?)", dir);
    Recipe r = load_recipe(rp, a.sets);
    // The run's world size: --gpus, else what its metrics.jsonl records (world_size), else t x p.
    const int64_t recorded = recorded_world_size(dir);
    const int64_t gpus = a.gpus > 0     ? a.gpus
                         : recorded > 0 ? recorded
                                        : r.tp() * r.cp() * r.pp() * std::max<int64_t>(1, a.dp);
    cost::Observation o{r, cost::layout_from_recipe(r, gpus),
                        measured_step_time(dir, r.training.global_batch_size, a.step_stat), dir};
    runs.push_back(std::move(o));
  }
  const cost::CalibrationResult res = cost::calibrate(base, runs, a.gpus_per_node, cost::software_profile(a.software));
  const std::string out = a.profile_out.empty() ? a.calibrate.front() + "/gpu-profile.json" : a.profile_out;
  nlohmann::json j = cost::gpu_profile_json(res.gpu);
  j["name"] = base.name + "-calibrated";
  j["description"] = fmt::format("{} fitted to {} run(s) by mtnlg plan --calibrate", base.name, runs.size());
  nlohmann::json fit = {{"base", base.name},
                        {"compute_scale", res.compute_scale},
                        {"bandwidth_scale", res.bandwidth_scale},
                        {"overhead_scale", res.overhead_scale},
                        {"latency_scale", res.latency_scale},
                        {"compute_slots", res.compute_slots},
                        {"free_parameters", res.free_parameters},
                        {"physical", res.physical},
                        {"at_bound", res.at_bound},
                        {"rms_relative_error", res.rms_relative_error}};
  nlohmann::json rj = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i)
    rj.push_back({{"run_dir", runs[i].label},
                  {"layout", runs[i].layout.describe()},
                  {"measured_s", runs[i].step_time_s},
                  {"predicted_s", res.predicted[i]}});
  fit["runs"] = rj;
  fit["software"] = a.software;
  fit["step_stat"] = a.step_stat;  // plan with the same --software to use these constants
  j["calibration"] = fit;
  write_plan_output("--profile-out", out, j.dump(2) + "\n");
  if (a.json) {
    j["profile_file"] = out;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("calibrate: %zu run(s) against %s, %d constant(s) fitted\n", runs.size(), base.name.c_str(),
              res.free_parameters);
  for (size_t i = 0; i < runs.size(); ++i)
    std::printf("  %-40s %-48s measured %.4f s, fitted %.4f s (%+.1f%%)\n", runs[i].label.c_str(),
                runs[i].layout.describe().c_str(), runs[i].step_time_s, res.predicted[i],
                100.0 * (res.predicted[i] / runs[i].step_time_s - 1.0));
  std::printf(
      "fit: GEMM efficiency x%.3g (%.3g of peak), memory bandwidth x%.3g (%.3g GB/s), kernel overhead x%.3g "
      "(%.3g us)\n",
      res.compute_scale, res.gpu.gemm_eff_max, res.bandwidth_scale, res.gpu.hbm_bw / 1e9, res.overhead_scale,
      res.gpu.kernel_overhead * 1e6);
  if (res.latency_scale != 1.0)
    std::printf("     communication latency x%.3g (%.3g us per step)\n", res.latency_scale, res.gpu.nvlink_alpha * 1e6);
  if (res.physical) {
    std::printf(
        "     physical ranges: GEMM efficiency <= 1, bandwidth <= the data sheet's %.3g GB/s (%.2f of it), "
        "kernel overhead %.2g..%.3g us; regularised toward %s\n",
        base.hbm_peak_bw / 1e9, res.gpu.hbm_bw / base.hbm_peak_bw, cost::kKernelOverheadRange[0] * 1e6,
        cost::kKernelOverheadRange[1] * 1e6, base.name.c_str());
    for (auto& b : res.at_bound) std::printf("     at its physical limit: %s\n", b.c_str());
  }
  if (res.compute_slots > 0)
    std::printf("     compute slots %.3g (processes of a node that compute at full speed at once)\n",
                res.compute_slots);
  std::printf("residual: %.2f%% rms relative error\n", 100.0 * res.rms_relative_error);
  std::printf("wrote %s (use: mtnlg plan RECIPE --gpu-profile %s)\n", out.c_str(), out.c_str());
}

// Slurm's --time cap for a generated script. Longer runs requeue themselves: SIGUSR1
// ten minutes before the limit -> checkpoint -> exit 75 -> `scontrol requeue`.
constexpr double kMaxJobSeconds = 48.0 * 3600.0;

// One shell word, single-quoted unless it is plainly safe.
std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=,:+@") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurm_time(double seconds) {
  const auto total = static_cast<int64_t>(std::ceil(seconds / 60.0)) * 60;
  return fmt::format("{}:{:02}:{:02}", total / 3600, (total / 60) % 60, total % 60);
}

// The directory --sbatch writes into must exist (checked before any search runs).
void check_sbatch_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::is_directory(dir)) throw_input("--sbatch {}: directory {} does not exist", path, dir.string());
  if (fs::is_directory(p)) throw_input("--sbatch {}: is a directory; name a file", path);
}

// The `--set` overrides that make `mtnlg train` run layout `l` (every layout key the
// search may change, so the script does not depend on the recipe's own choices).
std::vector<std::string> layout_sets(const Recipe& r, const cost::Layout& l) {
  int64_t per_virtual = 0;  // num_layers_per_virtual_pipeline_stage; 0 = plain 1F1B
  if (l.vp > 1) {
    per_virtual = r.model.num_layers / l.pp / l.vp;
    if (per_virtual < 1 || (r.model.num_layers / l.pp) / per_virtual != l.vp)
      throw_runtime("--sbatch: layout {} has no num_layers_per_virtual_pipeline_stage for {} layers", l.describe(),
                    r.model.num_layers);
  }
  std::vector<std::string> v = {
      fmt::format("parallel.tensor_model_parallel_size={}", l.tp),
      fmt::format("parallel.pipeline_model_parallel_size={}", l.pp),
      fmt::format("parallel.num_layers_per_virtual_pipeline_stage={}", per_virtual),
      fmt::format("training.micro_batch_size={}", l.micro_batch),
      fmt::format("parallel.recompute_granularity={}", to_string(l.recompute)),
      fmt::format("parallel.sequence_parallel={}", l.sequence_parallel ? "true" : "false"),
      fmt::format("parallel.use_distributed_optimizer={}", l.distributed_optimizer ? "true" : "false"),
      fmt::format("parallel.context_parallel_size={}", l.cp),
  };
  if (r.model.moe.enabled()) {
    v.push_back(fmt::format("parallel.expert_model_parallel_size={}", l.ep));
    v.push_back(fmt::format("parallel.expert_tensor_parallel_size={}", l.etp));
  }
  // Uneven stage splits (the search may choose them) must be spelled out.
  bool even = true;
  for (int64_t n : l.stage_layers) even = even && n == l.stage_layers.front();
  if (!even || !r.parallel.pipeline_layers.empty())
    v.push_back(fmt::format("parallel.pipeline_layers=[{}]", fmt::join(l.stage_layers, ",")));
  return v;
}

// A batch script for `gpus` GPUs in layout e.layout; see the file comment.
// The job's --time and the comment that explains it: the predicted run time plus 10% and
// 15 minutes for start-up, checkpoint loading and the final save; capped, since the job
// requeues itself at the limit and resumes.
struct JobTime {
  bool known = false;
  std::string time, note;
};
JobTime sbatch_time(const cost::Estimate& e) {
  JobTime j;
  j.known = e.run_iterations > 0 && e.run_seconds > 0;
  const double wanted = j.known ? e.run_seconds * 1.1 + 900.0 : kMaxJobSeconds;
  const bool capped = wanted > kMaxJobSeconds;
  j.time = slurm_time(std::min(wanted, kMaxJobSeconds));
  if (!j.known)
    j.note = "the recipe sets no run length, so the default cap is used";
  else if (capped)
    j.note = fmt::format(
        "the run needs about {:.1f} days: capped at {}; at the limit the job checkpoints, exits 75 "
        "and requeues itself (about {} jobs in all)",
        e.run_seconds / 86400.0, slurm_time(kMaxJobSeconds),
        static_cast<int64_t>(std::ceil(wanted / (kMaxJobSeconds - 600.0))));
  else
    j.note =
        fmt::format("predicted {:.1f} hours plus 10% and 15 minutes for start-up and saves", e.run_seconds / 3600.0);
  return j;
}

// The script's comment header and #SBATCH lines.
std::string sbatch_header(const PlanArgs& a, const Recipe& r, const cost::Estimate& e, const cost::Cluster& c,
                          const std::string& cmdline, int64_t nodes, int64_t per_node) {
  const cost::Layout& l = e.layout;
  const int64_t gpus = l.gpus();
  const JobTime jt = sbatch_time(e);
  const bool known = jt.known;
  const std::string& time = jt.time;
  const std::string& time_note = jt.note;
  std::string o;
  o += "#!/bin/bash\n";
  o += fmt::format("# {} on {} x {}: layout {}\n", r.name, gpus, c.gpu.name, l.describe());
  o += fmt::format("# Written by `{}`.\n", cmdline);
  if (known)
    o += fmt::format(
        "# Predicted (planner/cost_model, docs/PLANNER.md): {:.3f} s per iteration, {:.1f}% MFU, peak {:.1f} GiB "
        "per GPU; {} iterations in {:.1f} days, {:.3g} GPU-hours.\n",
        e.iteration_time, 100 * e.mfu, e.peak_memory / kGiB, e.run_iterations, e.run_seconds / 86400.0,
        e.run_gpu_hours);
  o += "# One Slurm task per GPU, started by srun through PMIx. Submit from the repository root:\n";
  o += fmt::format("#   mkdir -p logs && sbatch --export=ALL,SHARED=/lustre/proj/mtnlg {}\n", a.sbatch);
  o += "# Settings (environment variables, defaults below) and preemption: docs/SLURM.md.\n";
  o += "#\n";
  o += fmt::format("#SBATCH --job-name={}\n", r.name);
  o += fmt::format("#SBATCH --nodes={}\n", nodes);
  o += fmt::format("#SBATCH --ntasks-per-node={}\n", per_node);
  o += fmt::format("#SBATCH --gpus-per-node={}\n", per_node);
  o += fmt::format("#SBATCH --time={}\n", time);
  o += "#SBATCH --exclusive\n";
  o += "#SBATCH --requeue\n";
  o += "#SBATCH --signal=USR1@600\n";
  o += "#SBATCH --open-mode=append\n";
  o += "#SBATCH --output=logs/%x-%j.out\n";
  o += fmt::format("# (--time: {}.\n", time_note);
  o += "#  --signal=USR1@600: every task gets SIGUSR1 ten minutes before the time limit; mtnlg finishes the\n";
  o += "#  iteration, saves a checkpoint and exits 75, and this script requeues the job. --requeue: a\n";
  o += "#  preempted job, or one whose node failed, goes back to the queue with the same job id.)\n";
  return o;
}

// The script's body: site settings, the layout check, srun of `mtnlg train` with the
// layout's overrides, and the requeue on exit code 75.
std::string sbatch_body(const PlanArgs& a, const Recipe& r, const cost::Layout& l, int64_t nodes, int64_t per_node,
                        const std::string& extra_sets) {
  std::string o;
  o += "\nset -uo pipefail\n\n";
  o += "# --- site settings ----------------------------------------------------------------\n";
  o += "MTNLG_ROOT=${MTNLG_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}   # repo checkout; relative paths resolve here\n";
  o += "MTNLG_BIN=${MTNLG_BIN:-$MTNLG_ROOT/build/mtnlg}\n";
  o += fmt::format("RECIPE=${{RECIPE:-{}}}\n", shell_quote(a.recipe));
  o += "SHARED=${SHARED:-/shared/${USER:-$(id -un)}/mtnlg}                 # a file system every node mounts\n";
  o += fmt::format("RUN_NAME=${{RUN_NAME:-{}}}\n", shell_quote(r.name));
  o += "CKPT_DIR=${CKPT_DIR:-$SHARED/checkpoints/$RUN_NAME}   # save and load: resuming is automatic\n";
  o += "RUN_DIR=${RUN_DIR:-$SHARED/runs/$RUN_NAME}            # metrics.jsonl, TensorBoard, recipe\n";
  o += fmt::format("TP={}\nPP={}\nCP={}\nGPUS_PER_NODE={}\n\n", l.tp, l.pp, l.cp, per_node);
  o += "# --- layout check (before anything starts) ---------------------------------------------\n";
  o += fmt::format("NODES=${{SLURM_JOB_NUM_NODES:-${{SLURM_NNODES:-{}}}}}\n", nodes);
  o += "WORLD=$((NODES * GPUS_PER_NODE))\n";
  o += "if (( WORLD % (TP * CP * PP) != 0 )); then\n";
  o += fmt::format(
      "  echo \"{}: $NODES nodes x $GPUS_PER_NODE GPUs = $WORLD is not a multiple of tp*cp*pp = $((TP * CP * PP))\" "
      ">&2\n",
      r.name);
  o += "  exit 2\nfi\nDP=$((WORLD / (TP * CP * PP)))\n\n";
  o += "export NCCL_DEBUG=${NCCL_DEBUG:-WARN}     # INFO shows the rings/trees and the NICs chosen\n";
  o += "# export NCCL_IB_HCA=... NCCL_SOCKET_IFNAME=... (site-specific; docs/SLURM.md \"NCCL environment\")\n";
  o += "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}\n\n";
  o += "# MTNLG_DRY_RUN=1 prints the commands instead of running them; each then \"exits\" with\n";
  o += "# MTNLG_DRY_RUN_RC (default 0), to exercise the requeue path.\n";
  o += "run() {\n  if [[ -n ${MTNLG_DRY_RUN:-} ]]; then echo \"+ $*\"; return \"${MTNLG_DRY_RUN_RC:-0}\"; fi\n  "
       "\"$@\"\n}\n\n";
  o += "mkdir -p \"$CKPT_DIR\" \"$RUN_DIR\" logs\n";
  o += fmt::format(
      "echo \"{}: job ${{SLURM_JOB_ID:-?}} attempt $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )), $NODES nodes, world $WORLD "
      "= "
      "tp $TP x pp $PP x dp $DP x cp $CP\"\n",
      r.name);
  o += fmt::format("echo \"{}: checkpoints $CKPT_DIR, run dir $RUN_DIR\"\n\n", r.name);
  o += "# --kill-on-bad-exit: one failed rank ends the step at once. MTNLG_EXTRA: more arguments.\n";
  o += "cd \"$MTNLG_ROOT\" || exit 2\n";
  o += "# shellcheck disable=SC2086\n";
  o += "run srun --mpi=pmix --kill-on-bad-exit=1 \\\n";
  o += "  \"$MTNLG_BIN\" train \"$RECIPE\" --stopped-exit-code 75 \\\n";
  o += extra_sets;
  o += "    --set checkpoint.save=\"$CKPT_DIR\" \\\n";
  o += "    --set checkpoint.load=\"$CKPT_DIR\" \\\n";
  o += "    --set logging.dir=\"$RUN_DIR\" \\\n";
  o += "    ${MTNLG_EXTRA:-}\nrc=$?\n\n";
  o += "# 75 (EX_TEMPFAIL): mtnlg stopped early on SIGUSR1/SIGTERM after saving a checkpoint.\n";
  o += "if (( rc == 75 )); then\n";
  o += fmt::format("  echo \"{}: checkpoint saved before the time limit; requeueing job ${{SLURM_JOB_ID:-?}}\"\n",
                   r.name);
  o += "  run scontrol requeue \"${SLURM_JOB_ID:-}\"\n  exit 0\nfi\n";
  o += fmt::format("echo \"{}: mtnlg exited with $rc\"\nexit $rc\n", r.name);
  return o;
}

std::string sbatch_script(const PlanArgs& a, const Recipe& r, const cost::Estimate& e, const cost::Cluster& c) {
  const cost::Layout& l = e.layout;
  const int64_t gpus = l.gpus();
  const int64_t per_node = std::min(gpus, c.gpus_per_node);
  if (gpus % per_node != 0)
    throw_input("--sbatch: {} GPUs is not a whole number of nodes of {} GPUs (--gpus-per-node)", gpus, c.gpus_per_node);
  const int64_t nodes = gpus / per_node;
  std::string cmdline = fmt::format("mtnlg plan {} --gpus {} --gpu {}", a.recipe, gpus, c.gpu.name);
  if (c.gpus_per_node != 8) cmdline += fmt::format(" --gpus-per-node {}", c.gpus_per_node);
  for (auto& s : a.sets) cmdline += " --set " + s;
  if (a.search) cmdline += " --search";
  cmdline += " --sbatch " + a.sbatch;

  std::string extra_sets;  // the user's --set overrides, then the layout's (the layout wins)
  for (auto& s : a.sets) extra_sets += fmt::format("    --set {} \\\n", shell_quote(s));
  for (auto& s : layout_sets(r, l)) extra_sets += fmt::format("    --set {} \\\n", shell_quote(s));
  return sbatch_header(a, r, e, c, cmdline, nodes, per_node) + sbatch_body(a, r, l, nodes, per_node, extra_sets);
}

void write_sbatch(const std::string& path, const std::string& text) {
  write_plan_output("--sbatch", path, text, /*executable=*/true);
}

nlohmann::json layout_json(const cost::Layout& l) {
  return {{"tp", l.tp},
          {"pp", l.pp},
          {"dp", l.dp},
          {"cp", l.cp},
          {"cp_comm_type", to_string(l.cp_comm)},
          {"ep", l.ep},
          {"etp", l.etp},
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
  j["software"] = c.software.name;
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
  j["allocator_peak_gib"] = e.allocator_peak / kGiB;
  j["gpu_memory_gib"] = c.gpu.memory_bytes / kGiB;
  j["fits"] = e.fits;
  j["time_breakdown_s"] = {
      {"pipeline", e.pipeline_time}, {"data_parallel", e.dp_time}, {"optimizer", e.optimizer_time}};
  j["comm_bytes_per_iteration"] = {
      {"tp", e.comm.tp}, {"pp", e.comm.pp}, {"dp", e.comm.dp}, {"cp", e.comm.cp}, {"ep", e.comm.ep}};
  j["run"] = {{"iterations", e.run_iterations}, {"tokens", e.run_tokens},
              {"seconds", e.run_seconds},       {"days", e.run_seconds / 86400.0},
              {"gpu_hours", e.run_gpu_hours},   {"average_tokens_per_s", e.run_tokens_per_s}};
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
                        {"send_buffers_gib", m.send_buffers / kGiB},
                        {"workspace_gib", m.workspace / kGiB},
                        {"attention_workspace_gib", m.attention_workspace / kGiB},
                        {"allocator_gib", m.allocator / kGiB}}},
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
  if (c.software.trainer_activations)
    std::printf("software: %s (attention: %s)\n", c.software.name.c_str(),
                cost::trainer_unfused_attention(r, c) ? "unfused" : "flash");
  else
    std::printf("software: %s\n", c.software.name.c_str());
  std::printf("layout: %s, %lld microbatches per iteration\n", e.layout.describe().c_str(),
              static_cast<long long>(e.microbatches));
  if (r.model.moe.enabled()) {
    const int64_t V = r.model.padded_vocab_size(e.layout.tp);
    std::printf("experts: %lld (top %lld) on %lld expert-parallel ranks; %s parameters, %s active per token\n",
                static_cast<long long>(r.model.moe.num_experts), static_cast<long long>(r.model.moe.moe_router_topk),
                static_cast<long long>(e.layout.ep), human_count(model::parameter_count(r.model, V)).c_str(),
                human_count(model::active_parameter_count(r.model, V)).c_str());
  }
  std::printf("\n%6s %6s %10s %10s %10s %10s %10s %10s %10s %10s\n", "stage", "layers", "total GiB", "weights", "grads",
              "optim", "activ", "emb+logit", "buffers", "workspace");
  for (auto& m : e.stages)
    std::printf("%6lld %6lld %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n",
                static_cast<long long>(m.stage), static_cast<long long>(m.layers), m.total / kGiB, m.weights / kGiB,
                m.gradients / kGiB, m.optimizer / kGiB, m.activations / kGiB, (m.embedding + m.logits) / kGiB,
                m.comm_buffers / kGiB, m.workspace / kGiB);
  std::printf("\npeak memory      %.2f GiB of %.2f GiB: %s\n", e.peak_memory / kGiB, c.gpu.memory_bytes / kGiB,
              e.fits ? "fits" : "DOES NOT FIT");
  std::printf(
      "allocator peak   %.2f GiB in tensors and buffers (the training log's mem; the rest is the CUDA context, "
      "NCCL's buffers and fragmentation)\n",
      e.allocator_peak / kGiB);
  std::printf("iteration time   %.3f s (pipeline %.3f, data-parallel reduce %.3f, optimizer %.3f)\n", e.iteration_time,
              e.pipeline_time, e.dp_time, e.optimizer_time);
  std::printf("bubble           %.1f%% of the pipeline phase\n", 100.0 * e.bubble_fraction);
  std::printf("throughput       %.0f tokens/s\n", e.tokens_per_s);
  const bool gpt = model::gpt_flops_form(r.model);
  std::printf("TFLOP/s per GPU  %.1f hardware (Megatron convention%s), %.1f model (%s)\n", e.tflops_per_gpu,
              e.layout.recompute != RecomputeGranularity::full ? ""
              : gpt                                            ? ", 96-form under full recompute"
                                                               : ", full recompute's forward counted",
              e.model_tflops_per_gpu, gpt ? "72-form" : "Megatron-Core's count with GQA and SwiGLU");
  std::printf("MFU              %.1f%% (HFU %.1f%%) of %.0f TFLOP/s peak\n", 100 * e.mfu, 100 * e.hfu,
              c.gpu.peak_flops / 1e12);
  std::printf("comm per rank    tp %.2f GB, pp %.2f GB, dp %.2f GB%s sent per iteration\n", e.comm.tp / 1e9,
              e.comm.pp / 1e9, e.comm.dp / 1e9,
              (std::string(e.layout.cp > 1 ? fmt::format(", cp {:.2f} GB", e.comm.cp / 1e9) : "") +
               (e.layout.ep > 1 ? fmt::format(", ep {:.2f} GB", e.comm.ep / 1e9) : ""))
                  .c_str());
  if (e.run_iterations > 0)
    std::printf(
        "whole run        %lld iterations, %.3g tokens, %.1f days, %.3g GPU-hours (%.0f tokens/s average, ramp "
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
  write_plan_output("--svg", path, svg);
}

// --search: the best `top` layouts of `gpus` GPUs, printed as a table (unless --json) and
// kept in `search_json`; the estimate of the best one.
cost::Estimate search_layouts(const PlanArgs& a, const Recipe& r, const cost::Cluster& c, int64_t gpus,
                              nlohmann::json& search_json) {
  auto res = cost::search(r, gpus, c, static_cast<size_t>(std::max<int64_t>(1, a.top)));
  if (res.best.empty()) {
    std::string why;
    for (auto& [k, v] : res.rejected) why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", k, v);
    throw_input("{}: no layout of {} GPUs ({}) fits; {} layouts rejected ({})", a.recipe, gpus, c.gpu.name,
                res.considered, why);
  }
  cost::Estimate best = cost::estimate(r, res.best.front().layout, c);
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
  return best;
}

// The GPUs planned for: --gpus, or tp x cp x pp x --dp, else one model replica.
int64_t plan_gpus(const PlanArgs& a, const Recipe& r) {
  int64_t gpus = a.gpus;
  const int64_t mp = r.tp() * r.cp() * r.pp();
  if (a.dp > 0) {
    if (gpus > 0 && gpus != mp * a.dp)
      throw_input("--gpus {} does not equal tp x cp x pp x dp = {} x {} x {} x {}", gpus, r.tp(), r.cp(), r.pp(), a.dp);
    gpus = mp * a.dp;
  }
  return gpus > 0 ? gpus : mp;
}

void run_plan(const PlanArgs& a) {
  if (!a.calibrate.empty()) return run_calibrate(a);
  if (a.recipe.empty()) throw_input("plan: a RECIPE file is required (or --calibrate RUN_DIR)");
  if (!a.sbatch.empty()) check_sbatch_path(a.sbatch);
  std::vector<std::string> sets = a.sets;
  if (a.tp > 0) sets.push_back(fmt::format("parallel.tensor_model_parallel_size={}", a.tp));
  if (a.pp > 0) sets.push_back(fmt::format("parallel.pipeline_model_parallel_size={}", a.pp));
  Recipe r = load_recipe(a.recipe, sets);
  cost::Cluster c{a.gpu_profile.empty() ? cost::gpu_spec(a.gpu) : cost::load_gpu_profile(a.gpu_profile),
                  a.gpus_per_node, cost::software_profile(a.software)};
  if (a.gpus_per_node < 1) throw_input("--gpus-per-node {}: must be at least 1", a.gpus_per_node);
  const int64_t gpus = plan_gpus(a, r);
  cost::Estimate est;
  nlohmann::json search_json;
  CudnnCheck cudnn;
  if (a.search) {
    est = search_layouts(a, r, c, gpus, search_json);
    cudnn = check_cudnn(r, est.layout, c);  // the chosen layout's; the search counted the model's bytes
  } else {
    cost::Layout l = cost::layout_from_recipe(r, gpus);
    if (l.vp > 1 && !c.software.interleaved_schedule)
      throw_input("{}: --software {} has no interleaved schedule; set parallel.num_layers_per_virtual_pipeline_stage=0",
                  a.recipe, c.software.name);
    cudnn = check_cudnn(r, l, c);
    if (cudnn.planned) c.attention_workspace = cudnn.bytes();  // the installed cuDNN's answer, not the model's
    est = cost::estimate(r, l, c);
  }
  const std::string ramp_note = cost::ramp_problem(r, est.layout);
  if (a.json) {
    nlohmann::json j = estimate_json(est, c);
    j["warnings"] = nlohmann::json::array();
    if (!ramp_note.empty())
      j["warnings"].push_back(ramp_note + " (mtnlg train would reject this; ramp microbatches are rounded up here)");
    j["recipe"] = r.name;
    if (c.software.trainer_activations)  // the attention form this trainer runs for the plan
      j["attention_backend"] = cost::trainer_unfused_attention(r, c) ? "unfused" : "flash";
    if (a.search) j["search"] = search_json;
    j["cudnn"] = cudnn_json(cudnn);
    if (!a.sbatch.empty()) j["sbatch"] = a.sbatch;  // written below
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_human(r, est, c);
    print_cudnn(cudnn, r, est.layout, c);
    if (!ramp_note.empty())
      std::printf("warning          %s (mtnlg train would reject this; ramp microbatches are rounded up here)\n",
                  ramp_note.c_str());
  }
  if (!a.svg.empty()) write_svg(est, a.svg, r.name);
  if (!a.sbatch.empty()) {
    write_sbatch(a.sbatch, sbatch_script(a, r, est, c));
    // Under --json the object's "sbatch" key says so; stdout stays one JSON object.
    if (!a.json)
      std::printf("sbatch           wrote %s (layout %s)\n", a.sbatch.c_str(), est.layout.describe().c_str());
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Predict memory and throughput of a layout, or search for the best one");
  static PlanArgs a;
  cmd->add_option("recipe", a.recipe, "Recipe YAML file (not needed with --calibrate)");
  cmd->add_option("--set", a.sets,
                  "Override a recipe key: section.key=value (e.g. parallel.tensor_model_parallel_size=4); repeatable");
  // Counts are positive and bounded, so that products (tp x pp x dp) cannot overflow.
  const auto count = CLI::Range(int64_t{1}, int64_t{1} << 24);
  cmd->add_option("--gpus", a.gpus, "Number of GPUs (world size); default tp x pp (x --dp)")->check(count);
  cmd->add_option("--gpu", a.gpu, "GPU kind: a100-80g, h100-80g, h200-141g, or cpu (a starting point for --calibrate)")
      ->capture_default_str();
  cmd->add_option("--gpu-profile", a.gpu_profile,
                  "Use the GPU constants in this file (written by --calibrate) instead of --gpu");
  cmd->add_option("--software", a.software,
                  "Software profile: megatron-lm (Megatron-LM 2022), megatron-lm-2021, megatron-deepspeed (MT-NLG's "
                  "DeepSpeed pipeline), megatron-core (2024-25: fused attention, TP/DP/p2p overlap) or mtnlg (this "
                  "trainer: flash-style attention, its exact activation count; "
                  "on h100-80g/h200-141g the installed cuDNN is asked, without a GPU, whether it plans the recipe's "
                  "attention and how much workspace it needs, which the memory then counts); "
                  "--calibrate fits the GPU constants under it")
      ->capture_default_str();
  cmd->add_option(
      "--calibrate", a.calibrate,
      "Fit the GPU constants to this run directory's recipe.resolved.yaml + metrics.jsonl (repeatable: "
      "one run fits the compute rate, two add memory bandwidth, three add kernel overhead), or the GEMM "
      "curve and attention rates to a kernel benchmark file (scripts/bench/gpu_gemm_attn.py); writes a profile");
  cmd->add_option("--profile-out", a.profile_out,
                  "With --calibrate: the profile file to write (default RUN_DIR/gpu-profile.json)");
  cmd->add_option("--step-stat", a.step_stat,
                  "With --calibrate: a run's step time is the median of its iterations at the full batch (first left "
                  "out), or with min the fastest one (a shared, loaded machine only ever slows iterations down)")
      ->check(CLI::IsMember({"median", "min"}))
      ->capture_default_str();
  cmd->add_option("--gpus-per-node", a.gpus_per_node, "GPUs per node (NVLink domain)")
      ->capture_default_str()
      ->check(count);
  cmd->add_option("--tp", a.tp, "Override parallel.tensor_model_parallel_size")->check(count);
  cmd->add_option("--pp", a.pp, "Override parallel.pipeline_model_parallel_size")->check(count);
  cmd->add_option("--dp", a.dp, "Data-parallel size (sets --gpus to tp x cp x pp x dp)")->check(count);
  cmd->add_flag("--search", a.search, "Enumerate all layouts of --gpus GPUs and rank the feasible ones by throughput");
  cmd->add_option("--top", a.top, "With --search: how many ranked layouts to show")
      ->capture_default_str()
      ->check(count);
  cmd->add_flag("--json", a.json, "Print one JSON object (interface.md \"Plan\") instead of tables");
  cmd->add_option("--svg", a.svg, "Write the pipeline timeline of the (chosen) layout as SVG to this file");
  cmd->add_option("--sbatch", a.sbatch,
                  "Write a Slurm batch script that trains the (chosen) layout on --gpus GPUs to this file "
                  "(srun + PMIx, --time from the prediction, requeue on exit 75; docs/SLURM.md)");
  cmd->callback([] { run_plan(a); });
}

}  // namespace mtnlg::app
