// One registration function per command file (app/<concern>/cmd_*.cpp). Each adds its
// CLI11 subcommand and a callback; main() parses, runs the chosen callback, and maps
// exceptions to exit codes (core/error.hpp).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "parallel/communicator.hpp"

namespace mtnlg::app {

void register_recipe(CLI::App& app);
void register_train(CLI::App& app);
void register_data(CLI::App& app);
// `mtnlg data` subcommands are split across the files of app/data/: preprocess/inspect (cmd_data.cpp) and
// the curation stages one command each, dedup/quality/decontaminate/synth-corpus (cmd_data_stages.cpp).
void register_data_stages(CLI::App& data_cmd);
// `mtnlg data samples` (cmd_data_samples.cpp): the sample stream without training.
void register_data_samples(CLI::App& data_cmd);
// `mtnlg data extract` (cmd_data_extract.cpp): WARC/WET -> JSONL text shards.
void register_data_extract(CLI::App& data_cmd);
// `mtnlg data curate` (cmd_data_curate.cpp): the whole pipeline from one YAML recipe.
void register_data_curate(CLI::App& data_cmd);
void register_plan(CLI::App& app);
void register_eval(CLI::App& app);
void register_generate(CLI::App& app);
void register_checkpoint(CLI::App& app);
void register_report(CLI::App& app);

}  // namespace mtnlg::app
