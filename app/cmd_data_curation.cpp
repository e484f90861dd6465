#include "app/commands.hpp"

namespace mtnlg::app {

void register_data_curation(CLI::App& data_cmd) { (void)data_cmd; }

}  // namespace mtnlg::app
