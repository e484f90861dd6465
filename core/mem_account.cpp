#include "core/mem_account.hpp"

#include <atomic>

namespace mtnlg::mem {
namespace {
constexpr size_t kRoles = static_cast<size_t>(Role::count);
std::atomic<uint8_t> g_role{0};
std::array<std::atomic<int64_t>, kRoles> g_live{};
std::array<std::atomic<int64_t>, kRoles> g_peak{};
}  // namespace

std::string to_string(Role r) {
  switch (r) {
    case Role::workspace: return "workspace";
    case Role::weights: return "weights";
    case Role::grads: return "grads";
    case Role::optimizer: return "optimizer";
    case Role::activations: return "activations";
    case Role::count: break;
  }
  return "?";
}

Role on_alloc(int64_t bytes) {
  const uint8_t r = g_role.load(std::memory_order_relaxed);
  const int64_t now = g_live[r].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_peak[r].load(std::memory_order_relaxed);
  while (now > peak && !g_peak[r].compare_exchange_weak(peak, now, std::memory_order_relaxed)) {}
  return static_cast<Role>(r);
}

void on_free(int64_t bytes, Role r) { g_live[static_cast<size_t>(r)].fetch_sub(bytes, std::memory_order_relaxed); }

Role current_role() { return static_cast<Role>(g_role.load(std::memory_order_relaxed)); }

Snapshot snapshot() {
  Snapshot s;
  for (size_t i = 0; i < kRoles; ++i) {
    s.roles[i].live = g_live[i].load(std::memory_order_relaxed);
    s.roles[i].peak = g_peak[i].load(std::memory_order_relaxed);
  }
  return s;
}

void reset_peaks() {
  for (size_t i = 0; i < kRoles; ++i)
    g_peak[i].store(g_live[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
}

RoleScope::RoleScope(Role r) : prev_(current_role()) {
  g_role.store(static_cast<uint8_t>(r), std::memory_order_relaxed);
}
RoleScope::~RoleScope() { g_role.store(static_cast<uint8_t>(prev_), std::memory_order_relaxed); }

}  // namespace mtnlg::mem
