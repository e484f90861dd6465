#include "core/step_parts.hpp"

namespace mtnlg::timing {

namespace {
constexpr const char* kNames[kStepParts] = {"forward",    "backward",  "recompute",  "tp",   "pp",        "bubble",
                                            "dp",         "embedding", "mp",         "cp",   "optimizer", "data",
                                            "checkpoint", "host_sync", "validation", "other"};
constexpr const char* kLabels[kStepParts] = {"forward compute",
                                             "backward compute",
                                             "recompute",
                                             "tp communication exposed",
                                             "pp sends exposed",
                                             "pipeline bubble",
                                             "dp reduce exposed",
                                             "embedding all-reduce exposed",
                                             "grad-norm all-reduce (mp) exposed",
                                             "context-parallel exchange exposed",
                                             "optimizer",
                                             "data loading",
                                             "checkpoint stalls",
                                             "host syncs",
                                             "validation",
                                             "other"};
}  // namespace

const char* step_part_name(StepPart p) { return kNames[static_cast<size_t>(p)]; }
const char* step_part_label(StepPart p) { return kLabels[static_cast<size_t>(p)]; }

namespace detail {
StepClock& step_clock() {
  thread_local StepClock clock;
  return clock;
}
}  // namespace detail

void set_step_parts_enabled(bool on) {
  auto& c = detail::step_clock();
  c.on = on;
  c.acc = {};
  c.current = StepPart::other;
  c.since = std::chrono::steady_clock::now();
}

bool step_parts_enabled() { return detail::step_clock().on; }

void set_device_marker(DeviceMarker m) {
  auto& c = detail::step_clock();
  c.mark = m;
  if (m) m(c.current);  // the device's first mark: what runs from here on
}

StepPartTimes read_step_parts() {
  auto& c = detail::step_clock();
  if (!c.on) return {};
  detail::charge(c, std::chrono::steady_clock::now());
  StepPartTimes out = c.acc;
  c.acc = {};
  return out;
}

StepPart comm_step_part(const std::string& group, bool recv) {
  if (group == "tp") return StepPart::tp;
  if (group == "pp") return recv ? StepPart::bubble : StepPart::pp;
  if (group == "dp" || group == "dp_cp" || group == "edp") return StepPart::dp;  // edp: the experts' replicas
  if (group == "cp") return StepPart::cp;
  if (group == "embedding") return StepPart::embedding;
  if (group == "mp" || group == "emp") return StepPart::mp;
  if (group == "world") return StepPart::host_sync;
  return StepPart::other;
}

}  // namespace mtnlg::timing
