#include "core/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "core/log.hpp"

namespace mtnlg {

std::string human_count(double v) {
  const char* suffix[] = {"", "K", "M", "B", "T"};
  int i = 0;
  while (std::fabs(v) >= 1000.0 && i < 4) {
    v /= 1000.0;
    ++i;
  }
  if (i == 0) return fmt::format("{:.0f}", v);
  return fmt::format("{:.2f}{}", v, suffix[i]);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto total = static_cast<int64_t>(s + 0.5);
  int64_t d = total / 86400, h = (total / 3600) % 24, m = (total / 60) % 60, sec = total % 60;
  if (d > 0) return fmt::format("{}d{:02d}h", d, h);
  if (h > 0) return fmt::format("{}h{:02d}m", h, m);
  if (m > 0) return fmt::format("{}m{:02d}s", m, sec);
  return fmt::format("{}s", sec);
}

Progress::Progress(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled && !log::context().quiet && log::context().rank == 0),
      tty_(::isatty(STDERR_FILENO) != 0) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  if (!finished_) finish();
}

void Progress::add(int64_t n, int64_t secondary) {
  count_ += n;
  secondary_ += secondary;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_draw_).count();
  if (since >= (tty_ ? 0.2 : plain_interval_s_)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void Progress::draw(bool final) {
  double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = el > 0 ? count_ / el : 0.0;
  std::string line = fmt::format("{}: {} {}", label_, human_count(static_cast<double>(count_)), unit_);
  if (total_ > 0) {
    double frac = std::min(1.0, static_cast<double>(count_) / static_cast<double>(total_));
    int width = 24, filled = static_cast<int>(frac * width);
    line = fmt::format("{}: [{}{}] {:5.1f}% {}/{} {}", label_, std::string(filled, '#'),
                       std::string(width - filled, '.'), 100.0 * frac, human_count(count_), human_count(total_), unit_);
  }
  line += fmt::format(" | {} {}/s", human_count(rate), unit_);
  if (!secondary_unit_.empty())
    line += fmt::format(" | {} {}/s", human_count(el > 0 ? secondary_ / el : 0.0), secondary_unit_);
  if (total_ > 0 && !final && rate > 0) line += fmt::format(" | ETA {}", human_duration((total_ - count_) / rate));
  if (final) line += fmt::format(" | {}", human_duration(el));
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace mtnlg
