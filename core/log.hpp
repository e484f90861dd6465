// Logging: human lines to stdout (info) / stderr (warnings), prefixed with the rank
// when the world has more than one process. Only global rank 0 prints info lines
// unless `all_ranks` is asked for.
#pragma once
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace mtnlg::log {

struct Context {
  int rank = 0;
  int world = 1;
  bool quiet = false;
  bool debug = false;  // MTNLG_DEBUG=1: debug lines from every rank (stderr)
};
Context& context();

bool stdout_is_tty();

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  auto& c = context();
  if (c.quiet || c.rank != 0) return;
  std::string s = fmt::format(f, std::forward<Args>(args)...);
  std::fputs(s.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  auto& c = context();
  std::string s = fmt::format(f, std::forward<Args>(args)...);
  if (c.world > 1)
    std::fprintf(stderr, "[rank %d] warning: %s\n", c.rank, s.c_str());
  else
    std::fprintf(stderr, "warning: %s\n", s.c_str());
  std::fflush(stderr);
}

// Diagnostics for developers (host syncs per step, ...): stderr, every rank, only when
// context().debug is set (main() reads MTNLG_DEBUG).
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  auto& c = context();
  if (!c.debug) return;
  std::string s = fmt::format(f, std::forward<Args>(args)...);
  std::fprintf(stderr, "[rank %d] debug: %s\n", c.rank, s.c_str());
  std::fflush(stderr);
}

}  // namespace mtnlg::log
