// `mtnlg report`: one self-contained HTML page about a training run directory —
// plots of metrics.jsonl as inline SVG (drawn here, no JavaScript, nothing fetched),
// a summary table, eval results (*.json with a "results" key) and the resolved recipe.
//
// The pieces are separate functions so tests can check each: reading metrics.jsonl,
// tick placement, number formatting, one SVG plot, the whole page.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "app/report/explain.hpp"

namespace mtnlg::app::report {

// metrics.jsonl as columns. Every column has `rows` entries; a value that is missing,
// null, non-numeric or non-finite is NaN. When the file holds a resumed run (iterations
// that go back, because training restarted from a checkpoint and appended), the later
// rows replace the earlier ones from the restart iteration on, so the columns are what
// the run as a whole did, in increasing iteration order.
struct Metrics {
  std::string source;  // the file, for messages
  int64_t rows = 0;
  int64_t restarts = 0;                                // how many times iterations went back
  std::vector<std::string> keys;                       // in first-seen order
  std::map<std::string, std::vector<double>> columns;  // key -> one value per row

  // Validation and test records ({"iteration", "validation_loss", "validation_ppl"} or
  // test_*), written by the trainer when training.eval_interval > 0; not rows.
  struct HeldOut {
    double iteration = 0;
    bool test = false;
    double loss = 0, ppl = 0;  // NaN when missing / non-finite
  };
  std::vector<HeldOut> held_out;

  // MoE runs (metrics.jsonl's nested "moe_layers"): per row, per MoE layer, the step's
  // tokens per expert after drops, their min and max over their mean and the dropped
  // slots. Empty when no row has them, else one entry per row (empty for a row without
  // them), replaced on a restart like the columns.
  struct MoeLayer {
    int64_t layer = 0;
    std::vector<double> tokens;
    double min_over_mean = 0, max_over_mean = 0;
    int64_t dropped = 0;
  };
  std::vector<std::vector<MoeLayer>> moe;

  bool has(const std::string& key) const;  // present with at least one finite value
  // The column for key, or all-NaN if absent.
  std::vector<double> column(const std::string& key) const;
};

// Throws InputError (exit 2): "<file>: not found ..." when missing, "<file>:<line>: ..."
// for a line that is not a JSON object, has no numeric "iteration" or a "moe_layers" that
// is not an array of {"layer", "tokens_per_expert": [numbers], ...} objects, and "<file>:
// no logged iterations" when it has no rows.
Metrics read_metrics(const std::filesystem::path& file);

// Roughly `target` round tick positions (1, 2 or 5 times a power of ten) covering
// [lo, hi], all inside it. lo == hi gives that one value.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

// Short human form: 0, 0.125, 3.5e-5, 1.5K, 12M, 270B, 1.2T. Non-finite -> "n/a".
std::string format_number(double v);
// 1.5 GiB style.
std::string format_bytes(double bytes);
std::string html_escape(std::string_view s);

struct Series {
  std::string name;
  std::vector<double> y;  // same length as the plot's x; NaN = gap
  std::string colour = "#1f77b4";
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<double> x;  // increasing
  std::vector<Series> series;
  std::vector<double> marks_x;  // drawn as red ticks on the x axis (e.g. non-finite loss)
  std::string marks_label;      // legend text for the marks
  double y_scale = 1.0;         // y values are multiplied by this before drawing (e.g. 100 for %)
  int width = 560;
  int height = 300;
};

// One <svg> element: frame, grid, ticks with labels, axis labels, title, one <polyline>
// per run of finite points (a lone finite point is a <circle>), legend when there is
// more than one series or there are marks. Long series are thinned to the first, min,
// max and last point per pixel column, which keeps spikes visible.
std::string render_svg_plot(const PlotSpec& spec);

// One row of an eval results table (harness v0.3 shape: results.<task>.<metric>).
struct EvalRow {
  std::string file;
  std::string task;
  std::string metric;
  double value = 0;
  double stderr_ = -1;  // < 0: not reported
};
// Reads RUN_DIR/*.json and RUN_DIR/eval/*.json; files that are not JSON objects with a
// "results" object are skipped (a run dir may hold other JSON).
std::vector<EvalRow> read_eval_results(const std::filesystem::path& run_dir);

struct ReportSummary {
  std::filesystem::path output;
  int64_t iterations = 0;
  int64_t plots = 0;
  int64_t eval_rows = 0;
  int64_t funnel_rows = 0;  // rows of the corpus funnel (a `data curate` work_dir)
};

// The whole page as a string (throws like read_metrics). `explain`: the planner the
// "Where the time went" section compares with (app/report/explain.hpp).
std::string render_report_html(const std::filesystem::path& run_dir, ReportSummary* summary = nullptr,
                               const ExplainOptions& explain = {});
// Writes the page to `output` (empty: RUN_DIR/report.html) through a temporary name and
// a rename, so a reader never sees half a file.
ReportSummary write_report(const std::filesystem::path& run_dir, const std::filesystem::path& output,
                           const ExplainOptions& explain = {});

}  // namespace mtnlg::app::report
