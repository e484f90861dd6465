// The time explainer's reading side: where a run's steps went, rank by rank, against the
// planner's prediction for the same layout (docs/OPERATIONS.md, "Where the time went").
//
// Input: metrics.jsonl records with "step_parts" (logging.step_timing, written by
// app/train/step_timing.cpp) and recipe.resolved.yaml. The measured parts are each
// rank's mean seconds per iteration over the logged records, the first left out when
// there are several (start-up). The plan is `cost::estimate` of the run's recipe and
// layout on a GPU or calibrated profile with the `mtnlg` software profile, split into the
// same parts per pipeline stage (plan_stage_parts).
//
// Findings, largest first, each a sentence: a slow rank (its own work, i.e. everything
// but waiting in communication, exceeds its stage peers'), a pipeline stage imbalance
// (one stage computes longer than the plan's stage ratio says, the others wait in the
// bubble), and every part whose share of the step exceeds the plan's ("dp reduce
// exposed 31% of the step; the plan expected 4%"). A slow rank or stage absorbs the
// waiting it causes, so the first finding names the cause rather than a symptom.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/step_parts.hpp"

namespace mtnlg::app::report {

using PartSeconds = std::array<double, timing::kStepParts>;

struct RankParts {
  int64_t rank = 0, tp = 0, pp = 0, dp = 0;
  PartSeconds s{};  // mean seconds per iteration
  double total() const;
};

struct PlannedStage {
  int64_t stage = 0;
  PartSeconds s{};  // seconds per iteration
  double total() const;
};

struct Finding {
  double size = 0;  // share of the step it accounts for (orders the findings)
  std::string text;
};

struct ExplainOptions {
  std::string gpu;            // planner GPU entry; "" = RUN_DIR/gpu-profile.json if present, else "cpu"
  std::string gpu_profile;    // a profile file (`mtnlg plan --calibrate` writes one)
  int64_t gpus_per_node = 0;  // 0: the whole world on one node for "cpu" / profiles, 8 otherwise
};

struct Explanation {
  std::string run_dir;
  int64_t records = 0;  // metrics records with step_parts that were averaged
  int64_t first_iteration = 0, last_iteration = 0;
  std::vector<RankParts> ranks;
  std::vector<PlannedStage> plan;  // per pipeline stage; empty when no plan could be made
  std::string plan_source;         // how the plan was obtained, or why there is none
  std::vector<Finding> findings;   // largest first
  double dp_bytes = 0;             // rank 0's bytes sent in the dp reduction, last record
  // Whose clock the parts are: "host" (the training thread's), or on a GPU run "GPU" (CUDA
  // events on the compute stream: what the GPU spent in each part, step_parts_gpu).
  std::string clock = "host";
  // logging.gpu_profile: GPU seconds per iteration by op family, the last record that has
  // them (rank 0's), largest first; empty when the run did not profile.
  std::vector<std::pair<std::string, double>> op_families;
};

// Throws InputError (exit 2, one line) when RUN_DIR has no metrics.jsonl or no record
// with step_parts. A missing or unusable recipe leaves the plan empty (plan_source says why).
Explanation explain_run(const std::filesystem::path& run_dir, const ExplainOptions& o = {});

// The findings computed from measured and planned parts (explain_run's last step; tests
// call it on synthetic parts). `dp_bytes`: what rank 0 sent in the dp reduction per
// iteration (metrics.jsonl's bytes_sent_dp, ring model), for the dp finding's rates.
std::vector<Finding> find_gaps(const std::vector<RankParts>& ranks, const std::vector<PlannedStage>& plan,
                               double dp_bytes = 0);

// `mtnlg report --explain`: the findings, then one line per rank and per planned stage.
std::string explain_text(const Explanation& e);
// `mtnlg report --explain RUN_DIR`'s whole text: when the run left flight recorder dumps
// (RUN_DIR/flight_recorder/rank<R>.json, the device watchdog's, parallel/flight_recorder.hpp)
// first the hang or failure verdict naming the culprit rank, its group and collective, and
// the stage and micro batch it was on; then where the time went (explain_text), which a
// run that died early may lack (then one line says why). Without dumps: explain_text of
// explain_run, its errors included.
std::string explain_command_text(const std::filesystem::path& run_dir, const ExplainOptions& o = {});
// One <svg>: a horizontal stacked bar per rank (ms per iteration by part) and one per
// planned stage, with a legend.
std::string explain_svg(const Explanation& e);
// The report page's section (heading, findings, the chart); "" when the run has no parts.
std::string explain_html_section(const std::filesystem::path& run_dir, const ExplainOptions& o = {});

}  // namespace mtnlg::app::report
