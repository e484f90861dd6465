// parallel/comm_time.hpp: the time a communicator sits blocked is counted (for the
// compute time that straggler detection compares) and charged to the step's parts: a
// group's part, or a world collective as a host sync only where no other part is open.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "core/step_parts.hpp"
#include "parallel/comm_time.hpp"

using namespace mtnlg;

namespace {
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
double at(const timing::StepPartTimes& t, timing::StepPart p) { return t[static_cast<size_t>(p)]; }
}  // namespace

TEST_CASE("comm time: blocked time is counted and charged to the group, host syncs weakly", "[step_parts]") {
  timing::set_step_parts_enabled(true);
  (void)timing::read_step_parts();
  const double blocked0 = parallel::comm_blocked_seconds();
  {
    const timing::StepPartScope fwd(timing::StepPart::forward);
    {
      const parallel::CommBlockedScope tp(timing::StepPart::tp);
      sleep_ms(15);
    }
    {
      const parallel::CommBlockedScope world(timing::StepPart::host_sync);  // inside the forward: forward time
      sleep_ms(40);
    }
  }
  {
    const parallel::CommBlockedScope world(timing::StepPart::host_sync);  // over `other`: a host sync
    sleep_ms(10);
  }
  const timing::StepPartTimes t = timing::read_step_parts();
  timing::set_step_parts_enabled(false);
  CHECK(at(t, timing::StepPart::tp) >= 0.015);
  CHECK(at(t, timing::StepPart::forward) >= 0.040);
  CHECK(at(t, timing::StepPart::host_sync) >= 0.010);
  CHECK(at(t, timing::StepPart::host_sync) < 0.040);            // not the 40 ms inside the forward
  CHECK(parallel::comm_blocked_seconds() - blocked0 >= 0.065);  // every blocked scope counts
}
