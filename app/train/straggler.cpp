#include "app/train/straggler.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::app {

StragglerTracker::StragglerTracker(int64_t world, double margin, int64_t intervals)
    : margin_(margin),
      intervals_(intervals),
      run_(static_cast<size_t>(world), 0),
      warned_(static_cast<size_t>(world), false) {}

StragglerTracker::Verdict StragglerTracker::update(const std::vector<double>& t) {
  Verdict v;
  const size_t world = t.size();
  std::vector<double> peers;
  double worst = -1, worst_flagged = -1;
  for (size_t r = 0; r < world; ++r) {
    peers.clear();
    for (size_t q = 0; q < world; ++q)
      if (q != r) peers.push_back(t[q]);
    std::sort(peers.begin(), peers.end());
    const size_t m = peers.size();
    const double median = m == 0 ? 0.0 : m % 2 ? peers[m / 2] : 0.5 * (peers[m / 2 - 1] + peers[m / 2]);
    const double ratio = median > 0 ? t[r] / median : 0.0;
    if (ratio > worst) {
      worst = ratio;
      v.slowest_rank = static_cast<int64_t>(r);
      v.slowest_ratio = ratio;
    }
    if (ratio <= margin_ || t[r] - median < kMinExcessS) {  // back in line: the episode (if any) is over
      run_[r] = 0;
      warned_[r] = false;
      continue;
    }
    if (++run_[r] >= intervals_ && !warned_[r]) {
      warned_[r] = true;
      v.named.push_back({static_cast<int64_t>(r), run_[r], t[r], median, ratio});
    }
    if (warned_[r] && ratio > worst_flagged) {
      worst_flagged = ratio;
      v.straggler_rank = static_cast<int64_t>(r);
    }
  }
  return v;
}

namespace {
int64_t world_of(const parallel::ProcessGroups& g) { return g.world ? g.world->size() : 1; }
}  // namespace

StragglerDetector::StragglerDetector(const LoggingConfig& c, const parallel::ProcessGroups& g)
    : g_(g), margin_(c.straggler_margin), tracker_(world_of(g), c.straggler_margin, c.straggler_intervals) {
  const int64_t world = world_of(g);
  enabled_ = margin_ > 0 && c.straggler_intervals > 0 && world > 1;
  if (!enabled_) return;
  times_.assign(static_cast<size_t>(world), 0.0);
  // Every rank's host name, once at set-up (a sum of [world * 8] int64 where each rank
  // fills its own 64 bytes), for the warning.
  constexpr int64_t kWords = 8;
  std::vector<int64_t> names(static_cast<size_t>(world * kWords), 0);
  char buf[kWords * 8 + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) buf[0] = '\0';
  std::memcpy(names.data() + g.rank * kWords, buf, kWords * 8);
  g.world->all_reduce(names.data(), static_cast<int64_t>(names.size()), parallel::ReduceOp::sum);
  for (int64_t r = 0; r < world; ++r) {
    char h[kWords * 8 + 1] = {};
    std::memcpy(h, names.data() + r * kWords, kWords * 8);
    hosts_.emplace_back(h);
  }
}

void StragglerDetector::at_log(IterationStats& s) {
  if (!enabled_ || count_ == 0) return;
  std::fill(times_.begin(), times_.end(), 0.0);
  times_[static_cast<size_t>(g_.rank)] = sum_ / static_cast<double>(count_);
  sum_ = 0;
  count_ = 0;
  g_.world->all_reduce(times_.data(), static_cast<int64_t>(times_.size()), parallel::ReduceOp::sum);
  const StragglerTracker::Verdict v = tracker_.update(times_);
  s.slowest_rank = v.slowest_rank;
  s.slowest_ratio = v.slowest_ratio;
  s.straggler_rank = v.straggler_rank;
  if (g_.rank != 0) return;
  for (const auto& n : v.named)
    log::warn(
        "straggler: {} has been slower than the median of its peers by more than {:.0f}% for {} log "
        "intervals in a row (iteration {}: compute {:.1f} ms per iteration vs {:.1f} ms, {:.2f}x)",
        parallel::describe_rank(n.rank, hosts_[static_cast<size_t>(n.rank)]), 100 * (margin_ - 1), n.intervals,
        s.iteration, 1e3 * n.seconds, 1e3 * n.median, n.ratio);
}

}  // namespace mtnlg::app
