// Straggler detection (logging.straggler_margin / straggler_intervals, docs/RELIABILITY.md).
// Every iteration each rank adds its compute time (the step's wall time less the time it
// sat blocked in communication: a slow rank makes its peers wait inside collectives, so
// wall times are all the slowest one's); nothing is exchanged then. At a log iteration
// one all-reduce over the world of a [world] vector (each rank fills its own slot with
// its mean over the interval) gives every rank every rank's time, and the tracker decides.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "app/train/iteration_stats.hpp"
#include "config/recipe.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

// The decision, from each log interval's per-rank times alone. A rank whose time exceeds
// the median of the other ranks' by the margin for `intervals` log intervals in a row is
// named once per episode: the episode ends when it falls back under the margin. A rank
// must also be slower by at least kMinExcessS: below that, scheduling and timer noise on
// a shared CPU (milliseconds per step) would name ranks at random when the steps
// themselves take milliseconds.
class StragglerTracker {
 public:
  static constexpr double kMinExcessS = 0.05;
  struct Named {  // a rank named in this interval (its episode's first warning)
    int64_t rank = -1, intervals = 0;
    double seconds = 0, median = 0, ratio = 0;
  };
  struct Verdict {
    int64_t slowest_rank = -1;  // the largest time over its peers' median, and that ratio
    double slowest_ratio = 0;
    int64_t straggler_rank = -1;  // the slowest rank in a named episode; -1 when none is
    std::vector<Named> named;
  };
  StragglerTracker(int64_t world, double margin, int64_t intervals);
  Verdict update(const std::vector<double>& seconds);

 private:
  double margin_;
  int64_t intervals_;
  std::vector<int64_t> run_;
  std::vector<bool> warned_;
};

// The trainer's side: the interval's sums, the all-reduce, the warning (rank 0 prints it,
// naming the rank's coordinates and host), the log-iteration fields of IterationStats.
class StragglerDetector {
 public:
  // Collective when on (every rank's host name, once): every rank builds it.
  StragglerDetector(const LoggingConfig& c, const parallel::ProcessGroups& g);
  bool enabled() const { return enabled_; }
  void add(double compute_s) {
    sum_ += compute_s;
    ++count_;
  }
  // At a log iteration (every rank): fills s.slowest_rank / s.slowest_ratio /
  // s.straggler_rank and warns.
  void at_log(IterationStats& s);

 private:
  const parallel::ProcessGroups& g_;
  double margin_;
  bool enabled_ = false;
  double sum_ = 0;
  int64_t count_ = 0;
  std::vector<double> times_;
  std::vector<std::string> hosts_;
  StragglerTracker tracker_;
};

}  // namespace mtnlg::app
