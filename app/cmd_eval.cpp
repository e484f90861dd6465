#include "app/commands.hpp"

namespace mtnlg::app {

void register_eval(CLI::App& app) { (void)app; }

}  // namespace mtnlg::app
