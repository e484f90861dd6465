// Registration of `mtnlg report` (app/cmd_report.cpp). Kept out of app/commands.hpp so
// this command could be added without touching that shared header; app/main.cpp calls
// register_report(app) beside the other register_* functions.
#pragma once
#include <CLI/CLI.hpp>

namespace mtnlg::app {

void register_report(CLI::App& app);

}  // namespace mtnlg::app
