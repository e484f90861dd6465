#include "core/log.hpp"

#include <unistd.h>

namespace mtnlg::log {

Context& context() {
  static Context c;
  return c;
}

bool stdout_is_tty() { return ::isatty(STDOUT_FILENO) != 0; }

}  // namespace mtnlg::log
