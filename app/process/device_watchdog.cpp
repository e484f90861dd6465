#include "app/process/device_watchdog.hpp"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "core/switches.hpp"
#include "parallel/flight_recorder.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::app {

namespace {
bool nccl_watchdog_switch() { return switches::flag(Switch::nccl_watchdog).value_or(true); }
bool stats_wanted() { return switches::flag(Switch::watchdog_stats).value_or(false); }
}  // namespace

DeviceWatchdogRun::DeviceWatchdogRun(const std::string& run_dir, const parallel::ProcessGroups& g,
                                     double heartbeat_timeout_s)
    : on(g.device == Device::cuda && g.topo.world() > 1 && parallel::collective_timeout() > 0 &&
         nccl_watchdog_switch()),
      rank_(g.rank) {
  if (!on) return;
  // Rank 0 serves the liveness service before its address goes round. An address, a port
  // and a host name's hash are integers a double holds exactly; one max-reduce shares rank
  // 0's and tells whether every rank runs on one host (then the loopback address serves).
  double shared[5] = {0, 0, 0, 0, 0};  // token clock, IPv4 address, port, host hash, -host hash
  if (g.rank == 0) {
    shared[0] = parallel::wall_now();
    try {
      server_ = std::make_unique<parallel::LivenessServer>(g.topo.world(), heartbeat_timeout_s);
      shared[1] = parallel::ipv4_to_u32(parallel::liveness_host());
      shared[2] = server_->port();
    } catch (const RuntimeError& e) {  // no socket: warned; a bad MTNLG_WATCHDOG_ADDR is the user's to fix
      std::fprintf(stderr, "mtnlg: warning: %s; the NCCL watchdog goes on without it\n", e.what());
    }
  }
  const double h = static_cast<double>(std::hash<std::string>{}(parallel::host_name()) & 0xffffffffu);
  shared[3] = h;
  shared[4] = -h;
  g.world->all_reduce(shared, 5, parallel::ReduceOp::max);
  const bool one_host = shared[3] == -shared[4] && !switches::text(Switch::watchdog_addr);
  parallel::WatchdogOptions o;
  o.timeout_s = parallel::collective_timeout();
  o.run_dir = run_dir;
  o.token = fmt::format("{:x}", static_cast<uint64_t>(shared[0] * 1e6));
  o.rank = g.rank;
  o.world = g.topo.world();
  o.stage = g.coord.pp;
  o.coord = fmt::format("tp={},pp={},dp={}", g.coord.tp, g.coord.pp, g.coord.dp);
  o.liveness_host = one_host ? "127.0.0.1" : parallel::u32_to_ipv4(static_cast<uint32_t>(shared[1]));
  o.liveness_port = static_cast<int>(shared[2]);
  parallel::device_watchdog().start(o);
}

DeviceWatchdogRun::~DeviceWatchdogRun() {
  if (!on) return;
  const parallel::Watchdog::Stats st = parallel::device_watchdog().stats();
  parallel::device_watchdog().stop();
  if (stats_wanted()) {
    std::string served;
    if (server_) {
      const parallel::LivenessStats s = server_->stats();
      served = fmt::format(", service {} received {} sent", s.received, s.sent);
    }
    std::fprintf(
        stderr,
        "mtnlg: watchdog stats: rank %lld: %.2f s, %llu filesystem calls, %llu messages sent, %llu received%s\n",
        static_cast<long long>(rank_), st.seconds, static_cast<unsigned long long>(st.fs_calls),
        static_cast<unsigned long long>(st.sent), static_cast<unsigned long long>(st.received), served.c_str());
  }
}

}  // namespace mtnlg::app
