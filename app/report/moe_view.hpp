// Mixture-of-experts balance in `mtnlg report` and `report --explain`: the balancing and
// z losses as plots, a heat map of expert load over iterations, and the verdict on each MoE
// layer's routing (collapsed onto few experts, or dropping many slots) with what to change.
//
// Input: metrics.jsonl's `moe_load_balancing_loss`, `moe_z_loss` and nested `moe_layers`
// (read_metrics, app/report/report.hpp), and for the router's k, the balancing settings and
// the learning rate, recipe.resolved.yaml (when it cannot be read: k = 2, Megatron-Core's
// default, and advice without the current values).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "app/report/explain.hpp"
#include "app/report/report.hpp"

namespace mtnlg::app::report {

// Expert load over iterations: per MoE layer and expert, tokens / the mean over the
// layer's experts, averaged over the rows of each column (iterations binned when there
// are more rows than columns; NaN where no row had the layer or the expert).
struct MoeHeatMap {
  std::vector<int64_t> layers;                         // MoE layer indices in order
  int64_t experts = 0;                                 // the most experts any layer logged
  std::vector<std::pair<double, double>> columns;      // first and last iteration of each column
  std::vector<std::vector<std::vector<double>>> load;  // [layer][expert][column]
};

// At most `max_columns` columns (fewer when the map's cells would exceed `max_cells`:
// layers x experts x columns, so a 48-layer, 128-expert run still makes a page a browser
// opens). Empty (no layers) for a run without moe_layers.
MoeHeatMap moe_heat_map(const Metrics& m, int64_t max_columns = 160, int64_t max_cells = 60000);

// The colour of load ratio v (tokens / mean): blue at 0, near white at 1, dark red at
// `cap` and above, log-scaled above 1; grey for NaN. "#rrggbb".
std::string moe_load_colour(double v, double cap);

// One <svg>: the layers stacked (rows = experts, columns = iterations), each band named,
// the first and last iteration under the columns, and the colour legend.
std::string moe_heat_map_svg(const MoeHeatMap& map);

// What the verdict needs from the recipe.
struct MoeRouterFacts {
  bool from_recipe = false;  // false: recipe.resolved.yaml missing or unreadable, defaults below
  int64_t topk = 2;
  bool balancing = true;  // a balancing loss with a coefficient above 0
  double aux_coeff = 0;   // moe_aux_loss_coeff
  bool expert_bias = false;
  double lr = 0;
};
MoeRouterFacts moe_router_facts(const std::filesystem::path& run_dir);

// The verdict over the last quarter of the logged MoE rows (at least one row): per layer,
// the share of each step's slots that went to its k busiest experts, averaged over those
// rows. Balanced routing gives k / E, routing collapsed onto k experts 1. A layer is
// flagged as collapsed when its share is at least halfway between, i.e.
//   concentration = (share - k/E) / (1 - k/E) >= 0.5
// (docs/specs/moe.md, "balance you can see": the balancing loss's logged value runs from 1,
// uniform, to E/k, collapsed, and the tiny-moe runs sit far on either side). With a
// capacity, a layer that dropped more than 10% of its routed slots over those rows is
// flagged too. Findings largest first.
struct MoeVerdict {
  int64_t first_iteration = 0, last_iteration = 0;  // the rows judged
  int64_t layers = 0, experts = 0, topk = 2;
  double worst_concentration = 0;  // the most concentrated layer's, and that layer
  int64_t worst_layer = -1;
  double worst_share = 0;
  std::vector<Finding> findings;  // empty: every layer balanced
  std::string advice;             // what to change when a layer collapsed (from the recipe's settings)
};
MoeVerdict moe_verdict(const Metrics& m, const MoeRouterFacts& f);

// `report --explain`'s lines on routing: a heading naming the rows judged, then the
// findings with the advice, or one line saying every layer is balanced. "" for a run
// without moe_layers.
std::string moe_verdict_text(const MoeVerdict& v);
std::string moe_explain_text(const std::filesystem::path& run_dir);

// The report page's "Mixture of experts" section: the losses' plots (x as the training
// curves'), the findings and the heat map; "" for a run without moe_layers. `nplots`
// counts the plots added.
std::string moe_html_section(const Metrics& m, const std::filesystem::path& run_dir, const std::vector<double>& x,
                             const std::string& x_label, int64_t& nplots);

}  // namespace mtnlg::app::report
