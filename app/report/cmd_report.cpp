// `mtnlg report RUN_DIR [--output FILE.html]`: a self-contained HTML report of a training
// run (plots of metrics.jsonl as inline SVG, eval results, the resolved recipe), or of a
// `data curate` work_dir (the corpus funnel and the blend).
#include <memory>
#include <string>

#include "app/report/report.hpp"
#include "app/commands.hpp"
#include "core/log.hpp"

namespace mtnlg::app {

void register_report(CLI::App& app) {
  struct Options {
    std::string run_dir;
    std::string output;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "report", "Write one self-contained HTML page (inline SVG plots, eval results, resolved recipe) for a run directory, "
      "or the corpus funnel and blend for a `data curate` work_dir");
  cmd->add_option("run_dir", opt->run_dir, "Run directory (the recipe's logging.dir) holding metrics.jsonl, or a data curate work_dir")
      ->required();
  cmd->add_option("--output,-o", opt->output, "HTML file to write (default: RUN_DIR/report.html)");
  cmd->callback([opt] {
    const auto s = report::write_report(opt->run_dir, opt->output);
    if (s.iterations == 0 && s.funnel_rows > 0)
      log::info("wrote {} (corpus funnel: {} stage rows)", s.output.string(), s.funnel_rows);
    else
      log::info("wrote {} ({} iterations, {} plots, {} eval results)", s.output.string(), s.iterations, s.plots,
                s.eval_rows);
  });
}

}  // namespace mtnlg::app
