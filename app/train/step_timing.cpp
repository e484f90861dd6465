#include "app/train/step_timing.hpp"

#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/step_events.hpp"
#endif

namespace mtnlg::app {

StepTiming::StepTiming(const LoggingConfig& c, const parallel::ProcessGroups& g)
    : g_(g),
      enabled_(c.step_timing),
      device_(c.step_timing && g.device == Device::cuda),
      ops_(c.gpu_profile && g.device == Device::cuda) {}

StepTiming::~StepTiming() {
#ifdef MTNLG_HAVE_CUDA
  if (device_) cuda::stop_device_step_parts();
  if (ops_) cuda::set_op_profile(false);
#endif
}

void StepTiming::start() {
  timing::set_step_parts_enabled(enabled_);
#ifdef MTNLG_HAVE_CUDA
  if (device_) cuda::start_device_step_parts();
  if (ops_) cuda::set_op_profile(true);
#endif
  sum_ = {};
  count_ = 0;
  op_steps_ = 0;
}

void StepTiming::after_step() {
  ++op_steps_;
  if (!enabled_) return;
  const timing::StepPartTimes t = timing::read_step_parts();
  for (int i = 0; i < timing::kStepParts; ++i) sum_[static_cast<size_t>(i)] += t[static_cast<size_t>(i)];
  ++count_;
}

std::vector<double> StepTiming::gathered(const timing::StepPartTimes& sum) const {
  const int64_t world = g_.world ? g_.world->size() : 1;
  std::vector<double> all(static_cast<size_t>(world * timing::kStepParts), 0.0);
  double* mine = all.data() + g_.rank * timing::kStepParts;
  for (int i = 0; i < timing::kStepParts; ++i) mine[i] = sum[static_cast<size_t>(i)] / static_cast<double>(count_);
  if (world > 1) g_.world->all_reduce(all.data(), static_cast<int64_t>(all.size()), parallel::ReduceOp::sum);
  return all;
}

StepTiming::Parts StepTiming::at_log() {
  Parts p;
#ifdef MTNLG_HAVE_CUDA
  if (ops_ && op_steps_ > 0) {
    p.ops = cuda::read_op_profile();
    for (auto& [family, s] : p.ops) s /= static_cast<double>(op_steps_);
    op_steps_ = 0;
  }
#endif
  if (!enabled_ || count_ == 0) return p;
  p.host = gathered(sum_);
#ifdef MTNLG_HAVE_CUDA
  if (device_) p.gpu = gathered(cuda::read_device_step_parts());
#endif
  sum_ = {};
  count_ = 0;
  return p;
}

nlohmann::json step_parts_json(const std::vector<double>& parts, const parallel::Topology& topo) {
  nlohmann::json ranks = nlohmann::json::array();
  const int64_t world = static_cast<int64_t>(parts.size()) / timing::kStepParts;
  for (int64_t r = 0; r < world; ++r) {
    const parallel::Coord c = topo.coord(r);
    nlohmann::json j = {{"rank", r}, {"tp_rank", c.tp}, {"pp_rank", c.pp}, {"dp_rank", c.dp}};
    for (int i = 0; i < timing::kStepParts; ++i)
      j[timing::step_part_name(static_cast<timing::StepPart>(i))] =
          parts[static_cast<size_t>(r * timing::kStepParts + i)];
    ranks.push_back(std::move(j));
  }
  return {{"ranks", std::move(ranks)}};
}

}  // namespace mtnlg::app
