#include "core/cuda/step_events.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"

namespace mtnlg::cuda {

namespace {

// The marks since the last read, in stream order; events are kept for reuse.
struct DeviceMarks {
  std::vector<cudaEvent_t> pool;  // created, not in use
  std::vector<std::pair<cudaEvent_t, timing::StepPart>> marks;
};
thread_local DeviceMarks t_marks;

cudaEvent_t take_event() {
  auto& m = t_marks;
  if (!m.pool.empty()) {
    cudaEvent_t e = m.pool.back();
    m.pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return e;
}

void mark(timing::StepPart starting) {
  if (capturing()) return;  // a captured record is no timing point; the graph's launch is marked instead
  cudaEvent_t e = take_event();
  CUDA_CHECK(cudaEventRecord(e, stream()));
  t_marks.marks.emplace_back(e, starting);
}

// logging.gpu_profile's ops, in the order they were queued.
struct OpMarks {
  bool on = false;
  std::vector<std::pair<const char*, std::pair<cudaEvent_t, cudaEvent_t>>> ops;
};
thread_local OpMarks t_ops;

std::string family_of(const char* file) {
  const char* base = std::strrchr(file, '/');
  std::string s = base ? base + 1 : file;
  return s.substr(0, s.find('.'));
}

}  // namespace

void set_op_profile(bool on) { t_ops.on = on; }
bool op_profile_on() { return t_ops.on; }

OpScope::OpScope(const char* file) : file_(file) {
  if (!t_ops.on || capturing()) return;
  cudaEvent_t e = take_event();
  CUDA_CHECK(cudaEventRecord(e, stream()));
  start_ = e;
}

OpScope::~OpScope() {
  if (!start_) return;
  cudaEvent_t end = take_event();
  if (cudaEventRecord(end, stream()) != cudaSuccess)
    return;  // no throw from a destructor: the op's own error goes first
  t_ops.ops.push_back({file_, {static_cast<cudaEvent_t>(start_), end}});
}

std::vector<std::pair<std::string, double>> read_op_profile() {
  std::map<std::string, double> by;
  auto& ops = t_ops.ops;
  if (!ops.empty()) CUDA_CHECK(cudaEventSynchronize(ops.back().second.second));
  for (auto& [file, ev] : ops) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev.first, ev.second));
    by[family_of(file)] += static_cast<double>(ms) * 1e-3;
    t_marks.pool.push_back(ev.first);
    t_marks.pool.push_back(ev.second);
  }
  ops.clear();
  std::vector<std::pair<std::string, double>> out(by.begin(), by.end());
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

void start_device_step_parts() { timing::set_device_marker(mark); }

void stop_device_step_parts() {
  timing::set_device_marker(nullptr);
  auto& m = t_marks;
  for (auto& [e, part] : m.marks) m.pool.push_back(e);
  m.marks.clear();
  for (cudaEvent_t e : m.pool) cudaEventDestroy(e);
  m.pool.clear();
}

timing::StepPartTimes read_device_step_parts() {
  timing::StepPartTimes out{};
  auto& m = t_marks;
  if (m.marks.size() < 2) return out;
  CUDA_CHECK(cudaEventSynchronize(m.marks.back().first));
  for (size_t i = 0; i + 1 < m.marks.size(); ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, m.marks[i].first, m.marks[i + 1].first));
    out[static_cast<size_t>(m.marks[i].second)] += static_cast<double>(ms) * 1e-3;
  }
  // The last mark starts the next interval; the others go back to the pool.
  for (size_t i = 0; i + 1 < m.marks.size(); ++i) m.pool.push_back(m.marks[i].first);
  m.marks.erase(m.marks.begin(), m.marks.end() - 1);
  return out;
}

}  // namespace mtnlg::cuda
