// Mixture-of-experts balance on the report page and in `report --explain`: the losses'
// plots, the expert-load heat map and the routing verdict (app/report/moe_view.hpp).
#include "app/report/moe_view.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "config/recipe.hpp"
#include "core/error.hpp"

namespace mtnlg::app::report {

namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Each MoE layer's row in a row's list, by layer index (-1 where absent).
int64_t find_layer(const std::vector<Metrics::MoeLayer>& row, int64_t layer) {
  for (size_t i = 0; i < row.size(); ++i)
    if (row[i].layer == layer) return static_cast<int64_t>(i);
  return -1;
}

// The rows that carry MoE layers, with their iterations.
std::vector<size_t> moe_rows(const Metrics& m) {
  std::vector<size_t> rows;
  for (size_t i = 0; i < m.moe.size(); ++i)
    if (!m.moe[i].empty()) rows.push_back(i);
  return rows;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

MoeHeatMap moe_heat_map(const Metrics& m, int64_t max_columns, int64_t max_cells) {
  MoeHeatMap map;
  const std::vector<size_t> rows = moe_rows(m);
  if (rows.empty()) return map;
  for (size_t r : rows)
    for (const auto& l : m.moe[r]) {
      if (std::find(map.layers.begin(), map.layers.end(), l.layer) == map.layers.end()) map.layers.push_back(l.layer);
      map.experts = std::max(map.experts, static_cast<int64_t>(l.tokens.size()));
    }
  std::sort(map.layers.begin(), map.layers.end());
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t by_cells = max_cells / std::max<int64_t>(1, static_cast<int64_t>(map.layers.size()) * map.experts);
  const int64_t cols = std::max<int64_t>(1, std::min({n, max_columns, std::max<int64_t>(by_cells, 8)}));
  const auto iter = m.column("iteration");
  map.load.assign(map.layers.size(), std::vector<std::vector<double>>(static_cast<size_t>(map.experts),
                                                                      std::vector<double>(static_cast<size_t>(cols))));
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t lo = c * n / cols, hi = (c + 1) * n / cols;  // rows [lo, hi) of this column
    map.columns.emplace_back(iter[rows[lo]], iter[rows[hi - 1]]);
    for (size_t li = 0; li < map.layers.size(); ++li)
      for (int64_t e = 0; e < map.experts; ++e) {
        double sum = 0;
        int64_t count = 0;
        for (int64_t k = lo; k < hi; ++k) {
          const auto& row = m.moe[rows[k]];
          const int64_t at = find_layer(row, map.layers[li]);
          if (at < 0 || e >= static_cast<int64_t>(row[at].tokens.size())) continue;
          const double mean = mean_of(row[at].tokens);
          if (!(mean > 0)) continue;
          sum += row[at].tokens[e] / mean;
          ++count;
        }
        map.load[li][e][c] = count ? sum / static_cast<double>(count) : kNaN;
      }
  }
  return map;
}

std::string moe_load_colour(double v, double cap) {
  if (!std::isfinite(v)) return "#dddddd";
  struct Rgb {
    double r, g, b;
  };
  const Rgb blue{49, 54, 149}, white{247, 247, 247}, red{165, 0, 38};
  const auto mix = [](Rgb a, Rgb b, double t) {
    t = std::clamp(t, 0.0, 1.0);
    return Rgb{a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
  };
  const Rgb c =
      v <= 1 ? mix(blue, white, std::max(v, 0.0)) : mix(white, red, std::log(v) / std::log(std::max(cap, 1.0001)));
  return fmt::format("#{:02x}{:02x}{:02x}", static_cast<int>(std::lround(c.r)), static_cast<int>(std::lround(c.g)),
                     static_cast<int>(std::lround(c.b)));
}

namespace {

// The legend: a bar from 0 to cap (linear to 1 on its left half, log-scaled above on its
// right half) with ticks at 0, 0.5, 1 and the powers of two up to cap.
void write_heat_legend(std::ostringstream& o, int x0, int y, double cap) {
  const int w = 300, steps = 60;
  const auto pos = [&](double v) {
    return v <= 1 ? x0 + 0.5 * w * v : x0 + 0.5 * w + 0.5 * w * std::log(v) / std::log(cap);
  };
  for (int i = 0; i < steps; ++i) {
    const double t = (i + 0.5) / steps;  // position along the bar, back to a value
    const double v = t <= 0.5 ? 2 * t : std::exp((2 * t - 1) * std::log(cap));
    o << fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"10\" fill=\"{}\"/>\n",
                     x0 + double(w) * i / steps, y, double(w) / steps + 0.2, moe_load_colour(v, cap));
  }
  std::vector<double> ticks{0, 0.5, 1};
  for (double p = 2; p <= cap * 1.0001; p *= 2) ticks.push_back(p);
  for (double v : ticks)
    o << fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n", pos(v), y + 22,
                     format_number(v));
  o << fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"11\">tokens / mean over the layer's experts (grey: not logged)</text>\n",
      x0 + w + 14, y + 9);
}

}  // namespace

std::string moe_heat_map_svg(const MoeHeatMap& map) {
  if (map.layers.empty()) return "";
  const int left = 70, top = 34, plot_w = 720, gap = 8;
  const int cols = static_cast<int>(map.columns.size());
  const int cell_h = std::clamp(static_cast<int>(160 / std::max<int64_t>(map.experts, 1)), 2, 12);
  const int band = cell_h * static_cast<int>(map.experts);
  const int bands_h = static_cast<int>(map.layers.size()) * (band + gap);
  const int width = left + plot_w + 20, height = top + bands_h + 16 + 40;
  double cap = 2;
  for (const auto& l : map.load)
    for (const auto& e : l)
      for (double v : e)
        while (std::isfinite(v) && v > cap) cap *= 2;
  std::ostringstream o;
  o << fmt::format(
      "<svg class=\"plot moe-heat\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\">\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n",
      width, height, width, height);
  o << "<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">Expert load over iterations (rows: experts, "
       "expert 0 on top; columns: iterations)</text>\n";
  const double cw = double(plot_w) / cols;
  for (size_t li = 0; li < map.layers.size(); ++li) {
    const int y0 = top + static_cast<int>(li) * (band + gap);
    o << fmt::format("<text x=\"10\" y=\"{}\" font-size=\"12\">layer {}</text>\n", y0 + std::min(band, 14) - 2,
                     map.layers[li]);
    for (int64_t e = 0; e < map.experts; ++e)
      for (int c = 0; c < cols; ++c)
        o << fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>\n", left + c * cw,
                         y0 + static_cast<int>(e) * cell_h, cw + 0.2, cell_h, moe_load_colour(map.load[li][e][c], cap));
  }
  const int ya = top + bands_h + 4;
  o << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">iteration {}</text>\n", left, ya + 8,
                   format_number(map.columns.front().first));
  o << fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">iteration {}{}</text>\n", left + plot_w, ya + 8,
      format_number(map.columns.back().second),
      std::any_of(map.columns.begin(), map.columns.end(), [](const auto& c) { return c.first != c.second; })
          ? fmt::format(" ({} columns, iterations averaged)", map.columns.size())
          : "");
  write_heat_legend(o, left, ya + 16, cap);
  o << "</svg>\n";
  return o.str();
}

MoeRouterFacts moe_router_facts(const fs::path& run_dir) {
  MoeRouterFacts f;
  try {
    const Recipe r = load_recipe((run_dir / "recipe.resolved.yaml").string());
    const MoeConfig& c = r.model.moe;
    f.from_recipe = true;
    f.topk = c.moe_router_topk;
    f.aux_coeff = c.moe_aux_loss_coeff;
    f.balancing = c.moe_router_load_balancing_type != MoeLoadBalancing::none && c.moe_aux_loss_coeff > 0;
    f.expert_bias = c.moe_router_enable_expert_bias;
    f.lr = r.optimizer.lr;
  } catch (const std::exception&) {
    f = MoeRouterFacts{};  // no recipe: the defaults, said in the advice
  }
  return f;
}

namespace {

// The share of a step's slots taken by its k busiest experts.
double topk_share(std::vector<double> tokens, int64_t k) {
  std::sort(tokens.begin(), tokens.end(), std::greater<>());
  double top = 0, all = 0;
  for (size_t e = 0; e < tokens.size(); ++e) {
    all += tokens[e];
    if (static_cast<int64_t>(e) < k) top += tokens[e];
  }
  return all > 0 ? top / all : kNaN;
}

std::string collapse_advice(const MoeRouterFacts& f) {
  const std::string now_lr = f.from_recipe ? fmt::format("now {:g}; ", f.lr) : "";
  const std::string lr = "lower optimizer.lr (" + now_lr +
                         "tiny-moe's routers collapse at 3e-3 and not at 1e-3, whatever the balancing coefficient: "
                         "docs/specs/moe.md)";
  if (!f.balancing)
    return "turn the balancing loss on (model.moe_router_load_balancing_type: aux_loss with "
           "model.moe_aux_loss_coeff: 1e-2, Megatron-Core's usual value), or " +
           lr;
  return lr + ", raise model.moe_aux_loss_coeff" + (f.from_recipe ? fmt::format(" (now {:g})", f.aux_coeff) : "") +
         (f.expert_bias ? ", or raise model.moe_router_bias_update_rate (the expert bias is on)"
                        : ", or balance without the loss: model.moe_router_score_function: sigmoid with "
                          "model.moe_router_enable_expert_bias: true");
}

// Per layer over the judged rows: the mean top-k share and the slots kept and dropped.
struct LayerLoad {
  int64_t layer = 0, experts = 0, rows = 0;
  double share = 0, max_over_mean = 0, kept = 0, dropped = 0;
};

std::vector<LayerLoad> judged_layers(const Metrics& m, const std::vector<size_t>& rows, int64_t k) {
  std::vector<LayerLoad> out;
  for (size_t r : rows)
    for (const auto& l : m.moe[r]) {
      auto it = std::find_if(out.begin(), out.end(), [&](const LayerLoad& x) { return x.layer == l.layer; });
      if (it == out.end()) it = out.insert(out.end(), LayerLoad{l.layer});
      const double share = topk_share(l.tokens, k);
      if (!std::isfinite(share)) continue;
      it->experts = std::max(it->experts, static_cast<int64_t>(l.tokens.size()));
      it->share += share;
      it->max_over_mean += std::isfinite(l.max_over_mean) ? l.max_over_mean : 0.0;
      for (double t : l.tokens) it->kept += t;
      it->dropped += static_cast<double>(l.dropped);
      ++it->rows;
    }
  for (auto& l : out) {
    l.share /= double(std::max<int64_t>(l.rows, 1));
    l.max_over_mean /= double(std::max<int64_t>(l.rows, 1));
  }
  std::sort(out.begin(), out.end(), [](const LayerLoad& a, const LayerLoad& b) { return a.layer < b.layer; });
  return out;
}

}  // namespace

MoeVerdict moe_verdict(const Metrics& m, const MoeRouterFacts& f) {
  MoeVerdict v;
  std::vector<size_t> rows = moe_rows(m);
  if (rows.empty()) return v;
  rows.erase(rows.begin(), rows.end() - static_cast<std::ptrdiff_t>(std::max<size_t>(1, rows.size() / 4)));
  const auto iter = m.column("iteration");
  v.first_iteration = static_cast<int64_t>(iter[rows.front()]);
  v.last_iteration = static_cast<int64_t>(iter[rows.back()]);
  v.topk = f.topk;
  const auto aux = m.column("moe_load_balancing_loss");
  double aux_sum = 0;
  int64_t aux_n = 0;
  for (size_t r : rows)
    if (std::isfinite(aux[r])) aux_sum += aux[r], ++aux_n;
  for (const LayerLoad& l : judged_layers(m, rows, f.topk)) {
    ++v.layers;
    v.experts = std::max(v.experts, l.experts);
    if (l.rows == 0 || l.experts <= f.topk) continue;
    const double fair = double(f.topk) / double(l.experts);
    const double c = (l.share - fair) / (1 - fair);
    if (v.worst_layer < 0 || c > v.worst_concentration) {
      v.worst_concentration = c;
      v.worst_layer = l.layer;
      v.worst_share = l.share;
    }
    const std::string aux_text =
        aux_n
            ? fmt::format("; the balancing loss averaged {:.2f} over the layers (1 = uniform)", aux_sum / double(aux_n))
            : "";
    if (c >= 0.5)
      v.findings.push_back(
          {c, fmt::format("layer {}'s routing collapsed: over iterations {}-{} its {} busiest experts took {:.0f}% of "
                          "the slots (balanced: {:.0f}%, {} of {} experts), max/mean {:.2f}{}",
                          l.layer, v.first_iteration, v.last_iteration, f.topk, 100 * l.share, 100 * fair, f.topk,
                          l.experts, l.max_over_mean, aux_text)});
    if (c >= 0.5) v.advice = collapse_advice(f);
    const double drop_share = l.dropped / std::max(l.kept + l.dropped, 1.0);
    if (drop_share > 0.10)
      v.findings.push_back(
          {drop_share, fmt::format("layer {} dropped {:.0f}% of its routed slots over iterations {}-{} (the capacity "
                                   "bound): raise model.moe_expert_capacity_factor or balance its routing",
                                   l.layer, 100 * drop_share, v.first_iteration, v.last_iteration)});
  }
  std::stable_sort(v.findings.begin(), v.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.size > b.size; });
  return v;
}

namespace {
std::string balanced_text(const MoeVerdict& v) {
  const double fair = double(v.topk) / double(std::max<int64_t>(v.experts, 1));
  return fmt::format(
      "balanced: no layer's {} busiest experts took {:.3g}% of the slots or more (halfway from balanced to "
      "collapsed); the most concentrated, layer {}, {:.0f}%",
      v.topk, 100 * (fair + 0.5 * (1 - fair)), v.worst_layer, 100 * v.worst_share);
}
}  // namespace

std::string moe_verdict_text(const MoeVerdict& v) {
  if (v.layers == 0) return "";
  std::string out = fmt::format(
      "expert routing: {} MoE layer(s) of {} experts, top-{}, judged over iterations {}-{} (the last "
      "quarter of the logged MoE rows):\n",
      v.layers, v.experts, v.topk, v.first_iteration, v.last_iteration);
  if (v.findings.empty()) out += "  " + balanced_text(v) + "\n";
  for (size_t k = 0; k < v.findings.size(); ++k) out += fmt::format("  {}. {}\n", k + 1, v.findings[k].text);
  if (!v.advice.empty()) out += "  what to do about the collapse: " + v.advice + "\n";
  return out;
}

std::string moe_explain_text(const fs::path& run_dir) {
  // Only a file that mentions moe_layers is read whole (the time explainer reads the rest).
  std::ifstream in(run_dir / "metrics.jsonl", std::ios::binary);
  bool any = false;
  for (std::string line; !any && std::getline(in, line);) any = line.find("\"moe_layers\"") != std::string::npos;
  if (!any) return "";
  const Metrics m = read_metrics(run_dir / "metrics.jsonl");
  if (m.moe.empty()) return "";
  return moe_verdict_text(moe_verdict(m, moe_router_facts(run_dir)));
}

std::string moe_html_section(const Metrics& m, const fs::path& run_dir, const std::vector<double>& x,
                             const std::string& x_label, int64_t& nplots) {
  if (m.moe.empty()) return "";
  std::ostringstream h;
  h << "<h2>Mixture of experts</h2>\n";
  const MoeVerdict v = moe_verdict(m, moe_router_facts(run_dir));
  h << "<p class=\"note\">Routing judged over iterations " << v.first_iteration << "-" << v.last_iteration
    << " (the last quarter of the logged MoE rows), " << v.layers << " MoE layer(s) of " << v.experts
    << " experts, top-" << v.topk << ".</p>\n<ol class=\"moe-verdict\">\n";
  for (const auto& f : v.findings) h << "<li>" << html_escape(f.text) << "</li>\n";
  if (v.findings.empty()) h << "<li>" << html_escape(balanced_text(v)) << "</li>\n";
  h << "</ol>\n";
  if (!v.advice.empty()) h << "<p>What to do about the collapse: " << html_escape(v.advice) << ".</p>\n";
  h << "<div class=\"plots\">\n";
  const auto plot = [&](const char* title, const char* y_label, std::vector<Series> series) {
    PlotSpec p;
    p.title = title;
    p.x_label = x_label;
    p.y_label = y_label;
    p.x = x;
    p.series = std::move(series);
    h << render_svg_plot(p);
    ++nplots;
  };
  if (m.has("moe_load_balancing_loss") || m.has("moe_z_loss")) {
    std::vector<Series> s;
    if (m.has("moe_load_balancing_loss")) s.push_back({"balancing", m.column("moe_load_balancing_loss"), "#d62728"});
    if (m.has("moe_z_loss")) s.push_back({"z", m.column("moe_z_loss"), "#9467bd"});
    plot("MoE losses (mean over layers)", "loss / its coefficient (balancing: 1 = uniform)", std::move(s));
  }
  std::vector<double> hi(static_cast<size_t>(m.rows), kNaN), lo(static_cast<size_t>(m.rows), kNaN);
  for (size_t r = 0; r < m.moe.size(); ++r)
    for (const auto& l : m.moe[r]) {
      if (!(hi[r] >= l.max_over_mean)) hi[r] = l.max_over_mean;
      if (!(lo[r] <= l.min_over_mean)) lo[r] = l.min_over_mean;
    }
  plot("Expert load, worst layer", "tokens / mean", {{"max/mean", hi, "#d62728"}, {"min/mean", lo, "#1f77b4"}});
  h << "</div>\n<div class=\"plots\">\n" << moe_heat_map_svg(moe_heat_map(m)) << "</div>\n";
  return h.str();
}

}  // namespace mtnlg::app::report
