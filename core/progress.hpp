// Progress bar for long commands (preprocess, dedup, eval, convert). On a terminal it
// redraws one line with a bar, the rate and the ETA; otherwise it prints a plain line
// at most every `plain_interval_s` seconds, so logs collected by Slurm stay readable.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace mtnlg {

class Progress {
 public:
  // total <= 0 means unknown (no bar, no ETA). `unit` names what is counted ("docs").
  Progress(std::string label, int64_t total, std::string unit, bool enabled = true);
  ~Progress();
  void add(int64_t n, int64_t secondary = 0);  // secondary: e.g. tokens alongside docs
  void set_secondary_unit(std::string unit) { secondary_unit_ = std::move(unit); }
  void finish();
  int64_t count() const { return count_; }

 private:
  void draw(bool final);
  std::string label_, unit_, secondary_unit_;
  int64_t total_, count_ = 0, secondary_ = 0;
  bool enabled_, tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  double plain_interval_s_ = 10.0;
};

// "1.23M" style numbers and "1h02m" durations for human output.
std::string human_count(double v);
std::string human_duration(double seconds);

}  // namespace mtnlg
