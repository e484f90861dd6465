#include "app/process/device_watchdog.hpp"

#include "core/switches.hpp"
#include "parallel/flight_recorder.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::app {

namespace {
bool nccl_watchdog_switch() { return switches::flag(Switch::nccl_watchdog).value_or(true); }
}  // namespace

DeviceWatchdogRun::DeviceWatchdogRun(const std::string& run_dir, const parallel::ProcessGroups& g)
    : on(g.device == Device::cuda && g.topo.world() > 1 && parallel::collective_timeout() > 0 &&
         nccl_watchdog_switch()) {
  if (!on) return;
  double t = g.rank == 0 ? parallel::wall_now() : 0.0;
  g.world->all_reduce(&t, 1, parallel::ReduceOp::sum);
  parallel::WatchdogOptions o;
  o.timeout_s = parallel::collective_timeout();
  o.run_dir = run_dir;
  o.token = fmt::format("{:x}", static_cast<uint64_t>(t * 1e6));
  o.rank = g.rank;
  o.world = g.topo.world();
  o.stage = g.coord.pp;
  o.coord = fmt::format("tp={},pp={},dp={}", g.coord.tp, g.coord.pp, g.coord.dp);
  parallel::device_watchdog().start(o);
}

DeviceWatchdogRun::~DeviceWatchdogRun() {
  if (on) parallel::device_watchdog().stop();
}

}  // namespace mtnlg::app
