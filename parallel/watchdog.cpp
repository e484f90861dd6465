// Watchdog settings shared by every backend: the timeout in force and the layout used
// to name ranks. The waiting and the asking live in mpi_communicator.cpp.
//
// These are process-wide (like MPI's own state): one timeout per process, set by the
// command before the world is built and read by every communicator it creates. Only
// the main thread talks to MPI (MPI_THREAD_FUNNELED), so plain variables suffice.
#include "parallel/watchdog.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "core/switches.hpp"

namespace mtnlg::parallel {

namespace {

struct Settings {
  double requested = 0;       // what the command asked for
  std::optional<double> env;  // MTNLG_COLLECTIVE_TIMEOUT, when set
  bool env_read = false;
  std::optional<Topology> topo;
};

Settings& settings() {
  static Settings s;
  return s;
}

void read_env() {
  auto& s = settings();
  if (s.env_read) return;
  s.env_read = true;
  s.env = switches::number(Switch::collective_timeout);
}

}  // namespace

void set_collective_timeout(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw_input("collective timeout {} s: expected a number >= 0 (0 = off)", seconds);
  read_env();
  settings().requested = seconds;
}

double collective_timeout() {
  auto& s = settings();
  if (!s.env_read) read_env();
  return s.env ? *s.env : s.requested;
}

void set_watchdog_topology(const Topology& topo) { settings().topo = topo; }

std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "";
  return h;
}

std::string rank_coord(int64_t world_rank) {
  const auto& t = settings().topo;
  if (!t || world_rank < 0 || world_rank >= t->world()) return "";
  const Coord c = t->coord(world_rank);
  return fmt::format("tp={},pp={},dp={}", c.tp, c.pp, c.dp);
}

std::string describe_rank(int64_t world_rank, const std::string& host) {
  std::string inside = rank_coord(world_rank);
  if (!host.empty()) inside += (inside.empty() ? "host " : " host ") + host;
  return inside.empty() ? fmt::format("rank {}", world_rank) : fmt::format("rank {} ({})", world_rank, inside);
}

}  // namespace mtnlg::parallel
