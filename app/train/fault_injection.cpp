#include "app/train/fault_injection.hpp"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "core/error.hpp"
#include "core/ops.hpp"
#include "core/step_parts.hpp"
#include "core/switches.hpp"
#include "parallel/comm_time.hpp"
#include "parallel/flight_recorder.hpp"

namespace mtnlg::app {

FaultInjection fault_injection_from_env() {
  FaultInjection f;
  const auto env = switches::text(Switch::fault_inject);
  if (!env) return f;
  const std::string& spec = *env;
  auto bad = [&](const std::string& why) {
    throw_input(
        "MTNLG_FAULT_INJECT=\"{}\": {}; expected "
        "rank=R:iteration=I:mode=throw|abort|kill|stop|hang|sigterm|sigusr1|nan|overflow|"
        "slow|slow_dp[:ms=N]|bitflip_grad[:bit=N]|bitflip_param[:bit=N]|poison[:layer=L]",
        spec, why);
  };
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, ':');) {
    auto eq = part.find('=');
    if (eq == std::string::npos) bad("'" + part + "' is not key=value");
    std::string key = part.substr(0, eq), val = part.substr(eq + 1);
    if (key == "mode") {
      if (val != "throw" && val != "abort" && val != "kill" && val != "stop" && val != "hang" && val != "sigterm" &&
          val != "sigusr1" && val != "nan" && val != "overflow" && val != "slow" && val != "slow_dp" &&
          val != "bitflip_grad" && val != "bitflip_param" && val != "poison")
        bad("unknown mode '" + val + "'");
      f.mode = val;
    } else if (key == "rank" || key == "iteration" || key == "ms" || key == "bit" || key == "layer") {
      char* end = nullptr;
      long long x = std::strtoll(val.c_str(), &end, 10);
      if (val.empty() || *end != '\0' || (x < 0 && !(key == "layer" && x == -1)))
        bad("'" + val + "' is not a whole number");
      if (key == "bit" && x > 31) bad("bit " + val + " is not a bit of a 32-bit float (0..31)");
      (key == "rank"        ? f.rank
       : key == "iteration" ? f.iteration
       : key == "ms"        ? f.ms
       : key == "bit"       ? f.bit
                            : f.layer) = x;
    } else {
      bad("unknown key '" + key + "'");
    }
  }
  if (f.rank < 0 || f.iteration < 1 || f.mode.empty()) bad("rank, iteration (>= 1) and mode are all required");
  return f;
}

// mode=nan: from that iteration on, this rank's gradients are non-finite (the step is
// skipped and counted; max_nonfinite_in_a_row of them stop the run).
bool inject_nan(const FaultInjection& f, int64_t rank, int64_t iteration) {
  return f.active() && f.mode == "nan" && f.rank == rank && iteration >= f.iteration;
}

// mode=overflow: at that one iteration this rank's gradients are +inf (an fp16 overflow:
// the step is skipped on every rank and the loss scale backs off; the run goes on).
bool inject_overflow(const FaultInjection& f, int64_t rank, int64_t iteration) {
  return f.active() && f.mode == "overflow" && f.rank == rank && iteration == f.iteration;
}

// The modes that fire at one iteration on one rank inside the step (bitflip_*, poison).
bool inject_at(const FaultInjection& f, const char* mode, int64_t rank, int64_t iteration) {
  return f.active() && f.mode == mode && f.rank == rank && iteration == f.iteration;
}

// Flips bit `bit` of the middle element of an fp32 buffer (on any device).
void flip_bit(Tensor& t, int64_t bit) {
  Tensor h = t.to(Device::cpu);
  auto* p = static_cast<uint32_t*>(h.raw()) + h.numel() / 2;
  *p ^= 1u << bit;
  t.copy_from(h);
}

// mode=slow_dp: from that iteration on, this rank's dp reduction takes ms longer (a
// throttled link: blocked in dp communication, not computing).
void inject_slow_dp(const FaultInjection& f, int64_t rank, int64_t iteration) {
  if (!f.active() || f.mode != "slow_dp" || f.rank != rank || iteration < f.iteration) return;
  const parallel::CommBlockedScope blocked(timing::StepPart::dp);
  std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
}

void maybe_inject_fault(const FaultInjection& f, int64_t rank, int64_t iteration) {
  if (f.active() && f.mode == "slow" && f.rank == rank && iteration >= f.iteration) {  // every iteration from I on
    std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
    return;
  }
  if (!f.active() || f.rank != rank || f.iteration != iteration || f.mode == "nan" || f.mode == "overflow" ||
      f.mode.starts_with("slow") || f.mode.starts_with("bitflip") || f.mode == "poison")
    return;
  // Slurm's preemption / time-limit signals, delivered to this process for real.
  if (f.mode == "sigterm" || f.mode == "sigusr1") {
    std::raise(f.mode == "sigterm" ? SIGTERM : SIGUSR1);
    return;
  }
  // A rank that stops entering collectives (a stuck loader, a wedged stage): its next
  // device-group operation parks the training thread; the watchdogs end the run.
  if (f.mode == "hang") {
    parallel::device_watchdog().inject_hang();
    return;
  }
  std::fprintf(stderr, "mtnlg: rank %lld: MTNLG_FAULT_INJECT %s at iteration %lld\n", static_cast<long long>(rank),
               f.mode.c_str(), static_cast<long long>(iteration));
  std::fflush(stderr);
  if (f.mode == "kill") std::raise(SIGKILL);
  if (f.mode == "stop") {  // alive but silent (the collective watchdog's case); after SIGCONT it goes on
    std::raise(SIGSTOP);
    return;
  }
  if (f.mode == "abort") std::abort();
  throw_runtime("rank {}: fault injected by MTNLG_FAULT_INJECT at iteration {}", rank, iteration);
}

void FaultInjector::step_start(int64_t iteration, Tensor& params) const {
  if (inject_at(f_, "bitflip_param", rank_, iteration)) flip_bit(params, f_.bit);
}

void FaultInjector::gradients(int64_t iteration, Tensor& grads, bool replay) const {
  if (inject_nan(f_, rank_, iteration)) ops::fill(grads, std::nan(""));
  if (replay) return;
  if (inject_overflow(f_, rank_, iteration)) ops::fill(grads, INFINITY);
  if (inject_at(f_, "bitflip_grad", rank_, iteration)) flip_bit(grads, f_.bit);
}

FaultInjection checked_fault_injection(const Recipe& r, const parallel::ProcessGroups& g) {
  validate_layout(r, g.topo.world());
  return fault_injection_from_env();
}

}  // namespace mtnlg::app
