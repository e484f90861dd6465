#include "app/commands.hpp"

namespace mtnlg::app {

void register_train(CLI::App& app) { (void)app; }

}  // namespace mtnlg::app
