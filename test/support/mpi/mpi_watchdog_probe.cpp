// A multi-rank program in which one rank stops answering, for the collective watchdog
// (parallel/watchdog.hpp; run by expect_watchdog.sh with MTNLG_COLLECTIVE_TIMEOUT set).
// The victim is the last rank. Modes:
//   stop      the victim SIGSTOPs itself; the others wait in an all_reduce on dp
//   recv      the victim SIGSTOPs itself; rank 0 waits to receive from it, the others
//             in a barrier on dp
//   elsewhere the victim waits in a barrier on its own one-rank-less group while the
//             others all_reduce on dp (alive, but in another collective)
//   slow      the victim computes for 1 s before joining (less than the timeout): the
//             job must finish normally
// Every rank prints "finished" when it gets through; the watchdog must end the job
// (non-zero, naming the victim) in the first three modes.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "parallel/communicator.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;

namespace {
// Stops this process. When the launcher ends the job it may send SIGCONT before
// SIGTERM/SIGKILL: then wait for those, never go on as if nothing happened.
void stop_for_good() {
  raise(SIGSTOP);
  for (;;) pause();
}
}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "stop";
  try {
    auto world = init_world(detect_launch());
    const int64_t n = world->size(), victim = n - 1;
    ProcessGroups g = make_groups(world, Topology(1, 1, n));  // dp = rank: reports say dp=R
    std::vector<float> v(1000, 1.f);
    g.dp->all_reduce(v.data(), 1000, ReduceOp::sum);  // collective #1 on dp
    const bool me = world->rank() == victim;
    if (std::strcmp(mode, "stop") == 0) {
      if (me) stop_for_good();
      g.dp->all_reduce(v.data(), 1000, ReduceOp::sum);
    } else if (std::strcmp(mode, "recv") == 0) {
      if (me) stop_for_good();
      if (world->rank() == 0) {
        world->recv(v.data(), 10, victim, 7);
      } else if (!me) {
        // Start the barrier 1 s after rank 0's receive, so that the receive times out
        // first and is what gets reported (under load the two used to race).
        std::this_thread::sleep_for(std::chrono::seconds(1));
        g.dp->barrier();
      }
    } else if (std::strcmp(mode, "elsewhere") == 0) {
      // The victim alone is in a barrier of a group of its own; nobody else joins it.
      auto alone = world->split(me ? 1 : 0, 0, "alone");
      if (me) alone->barrier(), alone->all_reduce(v.data(), 1, ReduceOp::sum);
      if (me) {
        // Enter the endless wait 1 s after the others start theirs, so they time out
        // first and report (the victim's own wait would, later, blame rank 0).
        std::this_thread::sleep_for(std::chrono::seconds(1));
        std::vector<float> w(1);
        world->recv(w.data(), 1, 0, 9);  // waits forever: nobody sends
      }
      g.dp->all_reduce(v.data(), 1000, ReduceOp::sum);
    } else if (std::strcmp(mode, "slow") == 0) {
      if (me) std::this_thread::sleep_for(std::chrono::seconds(1));
      g.dp->all_reduce(v.data(), 1000, ReduceOp::sum);
      world->barrier();
    }
    std::printf("rank %lld: finished\n", static_cast<long long>(world->rank()));
    finalize_world();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    abort_world(e.exit_code());
  }
}
