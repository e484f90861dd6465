#include "app/commands.hpp"

namespace mtnlg::app {

void register_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare and curate training data");
  data->require_subcommand(1);
  register_data_curation(*data);
}

}  // namespace mtnlg::app
