#include "app/train/run_reports.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/process/preflight.hpp"
#include "app/train/step_timing.hpp"
#include "core/error.hpp"
#include "parallel/context_parallel.hpp"

namespace mtnlg::app {

MetricsWriter::MetricsWriter(const std::string& dir, bool active, const parallel::Topology& topo)
    : active_(active), topo_(topo) {
  if (!active_) return;
  std::filesystem::create_directories(dir);
  out_.open(std::filesystem::path(dir) / "metrics.jsonl", std::ios::app);
  if (!out_) throw_runtime("{}/metrics.jsonl: cannot open for writing", dir);
}

void MetricsWriter::write(const IterationStats& s, const Recipe& r, double loss_scale) {
  if (!active_) return;
  nlohmann::json j = {{"iteration", s.iteration},
                      {"consumed_samples", s.consumed_samples},
                      {"consumed_tokens", s.consumed_tokens},
                      {"loss", s.loss},
                      {"lr", s.lr},
                      {"global_batch_size", s.global_batch_size},
                      {"grad_norm", s.grad_norm},
                      {"step_time_s", s.step_time_s},
                      {"world_size", s.world_size},
                      {"tokens_per_s", s.tokens_per_s},
                      {"tflops_per_gpu", s.tflops_per_gpu},
                      {"mfu", s.mfu},
                      {"skipped", s.skipped_total},
                      {"nan_iterations", s.nan_total},
                      {"peak_memory_bytes", s.peak_memory_bytes},
                      {"reserved_memory_bytes", s.reserved_memory_bytes},
                      {"bytes_sent_tp", s.bytes_tp},
                      {"bytes_sent_pp", s.bytes_pp},
                      {"bytes_sent_dp", s.bytes_dp},
                      {"bytes_sent_cp", s.bytes_cp},
                      {"bytes_sent_ep", s.bytes_ep},
                      {"tensor_bytes_weights", s.mem_weights},
                      {"tensor_bytes_grads", s.mem_grads},
                      {"tensor_bytes_optimizer", s.mem_optimizer},
                      {"tensor_bytes_activations_peak", s.mem_activations_peak},
                      {"tensor_bytes_saved_activations_peak", s.mem_saved_activations_peak},
                      {"tensor_bytes_send_buffers_peak", s.mem_send_buffers_peak},
                      {"tensor_bytes_workspace_peak", s.mem_workspace_peak}};
  if (r.training.precision == Precision::fp16) j["loss_scale"] = loss_scale;
  if (s.moe) {  // MoE layers
    if (s.moe_aux_loss >= 0) j["moe_load_balancing_loss"] = s.moe_aux_loss;
    if (s.moe_z_loss >= 0) j["moe_z_loss"] = s.moe_z_loss;
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& l : s.moe_layers)
      layers.push_back({{"layer", l.layer},
                        {"tokens_per_expert", l.tokens},
                        {"min_over_mean", l.min_over_mean},
                        {"max_over_mean", l.max_over_mean},
                        {"dropped", l.dropped}});
    j["moe_layers"] = layers;
  }
  if (s.slowest_rank >= 0) {  // straggler detection (logging.straggler_margin)
    j["slowest_rank"] = s.slowest_rank;
    j["slowest_ratio"] = s.slowest_ratio;
    if (s.straggler_rank >= 0) j["straggler_rank"] = s.straggler_rank;
  }
  if (r.training.check_for_nan_in_loss_and_grad || r.training.loss_spike_threshold > 0) {  // spike forensics
    j["anomalies"] = s.anomalies_total;
    if (!s.anomaly.empty()) j["anomaly"] = s.anomaly;
  }
  if (!s.step_parts.empty()) j["step_parts"] = step_parts_json(s.step_parts, topo_);              // logging.step_timing
  if (!s.step_parts_gpu.empty()) j["step_parts_gpu"] = step_parts_json(s.step_parts_gpu, topo_);  // ... on a GPU
  if (!s.gpu_profile.empty()) {                                                                   // logging.gpu_profile
    nlohmann::json fam = nlohmann::json::object();
    for (const auto& [family, seconds] : s.gpu_profile) fam[family] = seconds;
    j["gpu_profile"] = fam;
  }
  if (s.gemm_fallbacks >= 0) j["gemm_fallbacks"] = s.gemm_fallbacks;              // CUDA runs
  if (s.cuda_graph_replays >= 0) j["cuda_graph_replays"] = s.cuda_graph_replays;  // training.enable_cuda_graph
  if (s.host_reads || s.host_uploads) {                                           // a device run: its host round trips
    j["host_reads"] = s.host_reads;
    j["host_uploads"] = s.host_uploads;
  }
  if (!std::isfinite(s.loss)) j["loss"] = nullptr;
  out_ << j.dump() << "\n";
  out_.flush();
  if (!out_) throw_write_failed("metrics.jsonl", "logging.dir");
}

MemoryReport::MemoryReport(const std::string& dir, const parallel::ProcessGroups& g, bool active) : g_(g) {
  if (!active) return;
  std::filesystem::create_directories(dir);
  auto path = std::filesystem::path(dir) / fmt::format("memory_rank{}.jsonl", g.rank);
  out_.open(path, std::ios::trunc);
  if (!out_) throw_runtime("{}: cannot open for writing", path.string());
}

void MemoryReport::write(const IterationStats& s) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"iteration", s.iteration},
                      {"rank", g_.rank},
                      {"tp_rank", g_.coord.tp},
                      {"pp_rank", g_.coord.pp},
                      {"dp_rank", g_.coord.dp},
                      {"cp_rank", g_.coord.cp},
                      {"weights", s.mem_weights},
                      {"grads", s.mem_grads},
                      {"optimizer", s.mem_optimizer},
                      {"activations_peak", s.mem_activations_peak},
                      {"saved_activations_peak", s.mem_saved_activations_peak},
                      {"send_buffers_peak", s.mem_send_buffers_peak},
                      {"workspace_peak", s.mem_workspace_peak}};
  out_ << j.dump() << "\n";
  out_.flush();
  if (!out_) throw_write_failed(fmt::format("memory_rank{}.jsonl", g_.rank), "logging.dir");
}

CommReport::CommReport(const std::string& dir, const parallel::ProcessGroups& g, bool active) : g_(g) {
  if (!active) return;
  std::filesystem::create_directories(dir);
  auto path = std::filesystem::path(dir) / fmt::format("bytes_rank{}.jsonl", g.rank);
  out_.open(path, std::ios::trunc);
  if (!out_) throw_runtime("{}: cannot open for writing", path.string());
}

void CommReport::reset() {
  cp_at_reset_ = parallel::cp_attention_times();
  moe_at_reset_ = model::moe_dispatch_times();
  for (auto* c : {g_.tp.get(), g_.pp.get(), g_.dp.get(), g_.grad_group().get(), g_.cp.get(), g_.embedding.get(),
                  g_.mp.get(), g_.world.get(), g_.ep.get(), g_.etp.get(), g_.edp.get(), g_.emp.get()})
    if (c) c->reset_bytes();
}

void CommReport::write(int64_t iteration, int64_t global_batch, int64_t micro_batches, int64_t dp_buckets,
                       int64_t dp_buckets_early) {
  if (!out_.is_open()) return;
  auto b = [](const std::shared_ptr<parallel::Communicator>& c) -> int64_t { return c ? c->bytes_sent() : 0; };
  const parallel::CpAttentionTimes t = parallel::cp_attention_times();
  const model::MoeDispatchTimes m = model::moe_dispatch_times();
  nlohmann::json j = {{"iteration", iteration},
                      {"rank", g_.rank},
                      {"tp_rank", g_.coord.tp},
                      {"pp_rank", g_.coord.pp},
                      {"dp_rank", g_.coord.dp},
                      {"cp_rank", g_.coord.cp},
                      {"global_batch_size", global_batch},
                      {"micro_batches", micro_batches},
                      {"tp", b(g_.tp)},
                      {"pp", b(g_.pp)},
                      {"dp", b(g_.grad_group())},
                      {"cp", b(g_.cp)},
                      {"ep", b(g_.ep)},
                      {"etp", b(g_.etp)},
                      {"edp", b(g_.edp)},
                      {"emp", b(g_.emp)},
                      {"embedding", b(g_.embedding)},
                      {"mp", b(g_.mp)},
                      {"world", b(g_.world)},
                      {"cp_attention_s", t.inside - cp_at_reset_.inside},
                      {"cp_wait_s", t.waiting - cp_at_reset_.waiting},
                      {"cp_attention_cpu_s", t.inside_cpu - cp_at_reset_.inside_cpu},
                      {"cp_wait_cpu_s", t.waiting_cpu - cp_at_reset_.waiting_cpu},
                      {"moe_dispatch_s", m.dispatch - moe_at_reset_.dispatch},
                      {"moe_exchange_s", m.exchange - moe_at_reset_.exchange},
                      {"dp_buckets", dp_buckets},
                      {"dp_buckets_started_early", dp_buckets_early}};
  out_ << j.dump() << "\n";
  out_.flush();
  if (!out_) throw_write_failed(fmt::format("bytes_rank{}.jsonl", g_.rank), "logging.dir");
}

std::string moe_log_part(const IterationStats& s, bool capacity) {
  if (!s.moe) return "";
  std::string out;
  if (s.moe_aux_loss >= 0) out += fmt::format(" | load balancing loss: {:.6E}", s.moe_aux_loss);
  if (s.moe_z_loss >= 0) out += fmt::format(" | z loss: {:.6E}", s.moe_z_loss);
  if (s.moe_layers.empty()) return out;
  const IterationStats::MoeLayerLoad *hi = &s.moe_layers[0], *lo = hi;
  int64_t dropped = 0;
  for (const auto& l : s.moe_layers) {  // the first layer wins a tie
    if (l.max_over_mean > hi->max_over_mean) hi = &l;
    if (l.min_over_mean < lo->min_over_mean) lo = &l;
    dropped += l.dropped;
  }
  out += fmt::format(" | expert load max/mean: {:.2f} (layer {}), min/mean: {:.2f} (layer {})", hi->max_over_mean,
                     hi->layer, lo->min_over_mean, lo->layer);
  if (capacity) out += fmt::format(" | dropped slots: {}", dropped);
  return out;
}

std::map<std::string, double> moe_tensorboard_scalars(const IterationStats& s, bool capacity) {
  std::map<std::string, double> out;
  if (!s.moe) return out;
  if (s.moe_aux_loss >= 0) out["load_balancing_loss"] = s.moe_aux_loss;
  if (s.moe_z_loss >= 0) out["z_loss"] = s.moe_z_loss;
  int64_t last = 0;
  for (const auto& l : s.moe_layers) last = std::max(last, l.layer);
  const size_t width = std::to_string(last).size();
  for (const auto& l : s.moe_layers) {
    const std::string layer = fmt::format("layer{:0{}}/", l.layer, width);
    out[layer + "max_over_mean"] = l.max_over_mean;
    out[layer + "min_over_mean"] = l.min_over_mean;
    if (capacity) out[layer + "dropped"] = static_cast<double>(l.dropped);
  }
  return out;
}

}  // namespace mtnlg::app
