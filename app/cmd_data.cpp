#include "app/commands.hpp"

namespace mtnlg::app {

void register_data(CLI::App& app) { (void)app; }

}  // namespace mtnlg::app
