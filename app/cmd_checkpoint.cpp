#include "app/commands.hpp"

namespace mtnlg::app {

void register_checkpoint(CLI::App& app) { (void)app; }

}  // namespace mtnlg::app
