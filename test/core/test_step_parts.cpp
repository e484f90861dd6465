// The step-parts clock (core/step_parts.hpp): every moment charged to exactly one
// part, the innermost scope winning, weak scopes only over `other`, nothing when off.
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/step_parts.hpp"

using namespace mtnlg::timing;

namespace {
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
double at(const StepPartTimes& t, StepPart p) { return t[static_cast<size_t>(p)]; }
}  // namespace

TEST_CASE("step parts: nested scopes charge the innermost part and sum to the wall time", "[step_parts]") {
  // t0 before the clock starts and the wall's end after its read: the parts' sum can then
  // only fall short of the wall (by what runs outside the clock), never pass it.
  const auto t0 = std::chrono::steady_clock::now();
  set_step_parts_enabled(true);
  {
    const StepPartScope fwd(StepPart::forward);
    sleep_ms(20);
    {
      const StepPartScope tp(StepPart::tp);  // a tp all-reduce inside the forward
      sleep_ms(20);
    }
    {
      const StepPartScope world(StepPart::host_sync, /*weak=*/true);  // stays forward time
      sleep_ms(10);
    }
  }
  {
    const StepPartScope world(StepPart::host_sync, /*weak=*/true);  // over `other`: a host sync
    sleep_ms(10);
  }
  sleep_ms(5);  // no scope: other
  const StepPartTimes t = read_step_parts();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(at(t, StepPart::forward) >= 0.030);
  CHECK(at(t, StepPart::tp) >= 0.020);
  CHECK(at(t, StepPart::tp) < 0.030);
  CHECK(at(t, StepPart::host_sync) >= 0.010);
  CHECK(at(t, StepPart::host_sync) < 0.020);
  CHECK(at(t, StepPart::other) >= 0.005);
  const double sum = std::accumulate(t.begin(), t.end(), 0.0);
  CHECK(sum <= wall + 1e-9);
  CHECK(sum >= wall - 0.002);  // what ran before the clock started and after its read
  // A second read holds only what came after the first.
  sleep_ms(2);
  const StepPartTimes t2 = read_step_parts();
  CHECK(at(t2, StepPart::forward) == 0.0);
  CHECK(at(t2, StepPart::other) >= 0.002);

  set_step_parts_enabled(false);
  {
    const StepPartScope fwd(StepPart::forward);
    sleep_ms(2);
  }
  const StepPartTimes off = read_step_parts();
  CHECK(std::accumulate(off.begin(), off.end(), 0.0) == 0.0);
}

TEST_CASE("step parts: communicator groups map to parts, pp receives to the bubble", "[step_parts]") {
  CHECK(comm_step_part("tp") == StepPart::tp);
  CHECK(comm_step_part("pp") == StepPart::pp);
  CHECK(comm_step_part("pp", true) == StepPart::bubble);
  CHECK(comm_step_part("dp", true) == StepPart::dp);
  CHECK(comm_step_part("embedding") == StepPart::embedding);
  CHECK(comm_step_part("mp") == StepPart::mp);
  CHECK(comm_step_part("world") == StepPart::host_sync);
  CHECK(comm_step_part("eval-tp") == StepPart::other);
  CHECK(std::string(step_part_name(StepPart::host_sync)) == "host_sync");
  CHECK(std::string(step_part_label(StepPart::dp)) == "dp reduce exposed");
}

namespace {
std::vector<StepPart> g_marks;
void record_mark(StepPart p) { g_marks.push_back(p); }
}  // namespace

// The device's clock is fed by marks at every change of the current part (a CUDA run
// records an event at each on the compute stream): the first mark on setting the marker,
// then one per change, none where a scope does not change the part.
TEST_CASE("step parts: the device marker sees every change of part, in order", "[step_parts]") {
  set_step_parts_enabled(true);
  g_marks.clear();
  set_device_marker(record_mark);
  {
    const StepPartScope fwd(StepPart::forward);
    { const StepPartScope tp(StepPart::tp); }
    { const StepPartScope again(StepPart::forward); }                  // no change: no mark
    { const StepPartScope weak(StepPart::host_sync, /*weak=*/true); }  // not over `other`: no scope
  }
  { const StepPartScope opt(StepPart::optimizer); }
  set_device_marker(nullptr);
  { const StepPartScope bwd(StepPart::backward); }  // no marker: nothing
  set_step_parts_enabled(false);
  const std::vector<StepPart> want{StepPart::other, StepPart::forward,   StepPart::tp,   StepPart::forward,
                                   StepPart::other, StepPart::optimizer, StepPart::other};
  CHECK(g_marks == want);
}
