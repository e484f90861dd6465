// `mtnlg report RUN_DIR [--output FILE.html]`: a self-contained HTML report of a training
// run (plots of metrics.jsonl as inline SVG, an MoE run's expert load, where the time went
// against the plan, eval results, the resolved recipe), or of a `data curate` work_dir (the corpus funnel and the
// blend). `mtnlg report --explain RUN_DIR` prints where the time went as text.
#include <cstdio>
#include <memory>
#include <string>

#include "app/report/explain.hpp"
#include "app/report/report.hpp"
#include "app/commands.hpp"
#include "core/log.hpp"

namespace mtnlg::app {

void register_report(CLI::App& app) {
  struct Options {
    std::string run_dir;
    std::string output;
    bool explain = false;
    report::ExplainOptions plan;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "report",
      "Write one self-contained HTML page (inline SVG plots, where the time went against the plan, eval results, "
      "resolved recipe) for a run directory, or the corpus funnel and blend for a `data curate` work_dir");
  cmd->add_option("run_dir", opt->run_dir,
                  "Run directory (the recipe's logging.dir) holding metrics.jsonl, or a data curate work_dir")
      ->required();
  cmd->add_option("--output,-o", opt->output, "HTML file to write (default: RUN_DIR/report.html)");
  cmd->add_flag(
      "--explain", opt->explain,
      "Print where the time went instead (each rank's step parts from metrics.jsonl, logging.step_timing) against "
      "the planner's prediction for the run's recipe and layout, largest gaps first; no page is written. When the "
      "run's NCCL watchdog left flight recorder dumps (RUN_DIR/flight_recorder), first what ended the run: the "
      "culprit rank, the group and collective it never entered, the stage and micro batch it was on. For an MoE run, "
      "first of all the routing verdict: a layer whose routing collapsed onto few experts (or drops many slots) and "
      "what to change");
  cmd->add_option(
      "--gpu", opt->plan.gpu,
      "Planner GPU entry to compare with (a100-80g|h100-80g|h200-141g|cpu; default: RUN_DIR/gpu-profile.json "
      "when present, else cpu)");
  cmd->add_option("--gpu-profile", opt->plan.gpu_profile,
                  "Planner constants from this file (`mtnlg plan --calibrate` writes one)");
  cmd->add_option(
      "--gpus-per-node", opt->plan.gpus_per_node,
      "Processes per node for the plan (default: the whole run on one node for cpu and profiles, 8 for GPUs)");
  cmd->callback([opt] {
    if (opt->explain) {
      const std::string text = report::explain_command_text(opt->run_dir, opt->plan);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return;
    }
    const auto s = report::write_report(opt->run_dir, opt->output, opt->plan);
    if (s.iterations == 0 && s.funnel_rows > 0)
      log::info("wrote {} (corpus funnel: {} stage rows)", s.output.string(), s.funnel_rows);
    else
      log::info("wrote {} ({} iterations, {} plots, {} eval results)", s.output.string(), s.iterations, s.plots,
                s.eval_rows);
  });
}

}  // namespace mtnlg::app
