// `mtnlg data curate PIPELINE.yaml`: the command line of the corpus pipeline, whose
// engine is data/curation/pipeline.* (stages, manifests, resume). One process, or every
// rank of an mpirun/srun job (the dedup stage runs across them).
#include <memory>
#include <string>

#include "app/commands.hpp"
#include "app/process/rank_job.hpp"
#include "data/curation/pipeline.hpp"

namespace mtnlg::app {

namespace {

void run_curate(const std::string& file, bool progress) {
  run_on_ranks(parallel::detect_launch(), [&](WorldRankComm& comm) {
    curation::run_pipeline(comm, file, progress);
    return 0;
  });
}

}  // namespace

void register_data_curate(CLI::App& data) {
  auto file = std::make_shared<std::string>();
  auto no_progress = std::make_shared<bool>(false);
  auto* c = data.add_subcommand(
      "curate",
      "Run the whole corpus pipeline of a YAML recipe: extract (WARC) or join (JSONL) each source, quality-filter, "
      "dedup across sources by priority, decontaminate, tokenize, and write the blend (data.blend) with a funnel "
      "report; a re-run skips the stages whose manifest still matches");
  c->add_option("pipeline", *file, "Pipeline YAML (see docs/CURATION.md, \"One recipe: data curate\")")->required();
  c->add_flag("--no-progress", *no_progress, "Do not draw progress bars");
  c->footer(
      "Outputs under work_dir: 1-source/, 2-quality/, 3-dedup/, 4-decontam/, 5-tokens/ (each stage's files and "
      "<name>.manifest.json), blend.yaml, train.yaml (with blend.recipe), curate_report.json and .md. Paths in the "
      "pipeline file are relative to its directory. Under mpirun/srun the dedup stage runs across the ranks and rank 0 "
      "runs the others; the outputs are the same bytes for any rank count.");
  c->callback([file, no_progress] { run_curate(*file, !*no_progress); });
}

}  // namespace mtnlg::app
