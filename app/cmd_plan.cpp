#include "app/commands.hpp"

namespace mtnlg::app {

void register_plan(CLI::App& app) { (void)app; }

}  // namespace mtnlg::app
