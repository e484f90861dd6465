#include "app/commands.hpp"

namespace mtnlg::app {

void register_generate(CLI::App& app) { (void)app; }

}  // namespace mtnlg::app
