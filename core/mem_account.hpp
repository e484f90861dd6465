// Live and peak tensor bytes by role, counted where Storage is allocated and freed
// (core/tensor.cpp): what the trainer actually holds for weights, gradients, optimizer
// state, activations and everything else ("workspace": temporaries, communication
// buffers, data). The role of an allocation is the process-wide current role, set by a
// RoleScope around the code that allocates (ParamStore::finalize, the optimizer, the
// pipeline's forward passes). A relaxed atomic add per allocation and per free; used by
// `mtnlg train` (metrics.jsonl, --memory-report) and its test against `mtnlg plan`.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace mtnlg::mem {

enum class Role : uint8_t { workspace = 0, weights, grads, optimizer, activations, count };
std::string to_string(Role r);

struct RoleBytes {
  int64_t live = 0;  // bytes allocated under the role and not yet freed
  int64_t peak = 0;  // the most live at any time since the last reset_peaks()
};
struct Snapshot {
  std::array<RoleBytes, static_cast<size_t>(Role::count)> roles{};
  const RoleBytes& operator[](Role r) const { return roles[static_cast<size_t>(r)]; }
};

// Called by Storage: returns the role the bytes were counted under (kept by the Storage
// so the free is counted under the same role).
Role on_alloc(int64_t bytes);
void on_free(int64_t bytes, Role r);

Role current_role();
Snapshot snapshot();
// Peaks restart from the live values (e.g. after set-up, before the first step).
void reset_peaks();

// Sets the current role for its lifetime (not thread-specific: the trainer's
// allocations happen on its main thread).
class RoleScope {
 public:
  explicit RoleScope(Role r);
  ~RoleScope();
  RoleScope(const RoleScope&) = delete;
  RoleScope& operator=(const RoleScope&) = delete;

 private:
  Role prev_;
};

}  // namespace mtnlg::mem
