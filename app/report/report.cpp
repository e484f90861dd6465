// `mtnlg report` implementation: metrics.jsonl reader, SVG line plots, the HTML page.
// Everything is plain text generation; the page has no scripts, links or URLs, so it
// opens the same from a laptop, a cluster login node or an e-mail attachment.
#include "app/report/report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "app/report/moe_view.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

#ifndef MTNLG_VERSION
#define MTNLG_VERSION "dev"
#endif

namespace mtnlg::app::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string strip_json_prefix(std::string msg) {
  // nlohmann messages start with "[json.exception.parse_error.101] "; the id helps nobody.
  if (!msg.empty() && msg[0] == '[') {
    auto close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
  }
  return msg;
}

std::string fmt_coord(double v) { return fmt::format("{:.1f}", v); }

double median_of(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double last_finite(const std::vector<double>& v) {
  for (auto it = v.rbegin(); it != v.rend(); ++it)
    if (std::isfinite(*it)) return *it;
  return kNaN;
}

double max_finite(const std::vector<double>& v) {
  double m = kNaN;
  for (double x : v)
    if (std::isfinite(x) && !(x <= m)) m = x;
  return m;
}

double min_finite(const std::vector<double>& v) {
  double m = kNaN;
  for (double x : v)
    if (std::isfinite(x) && !(x >= m)) m = x;
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------
// metrics.jsonl
// ---------------------------------------------------------------------------------

bool Metrics::has(const std::string& key) const {
  auto it = columns.find(key);
  if (it == columns.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(), [](double x) { return std::isfinite(x); });
}

std::vector<double> Metrics::column(const std::string& key) const {
  auto it = columns.find(key);
  if (it == columns.end()) return std::vector<double>(static_cast<size_t>(rows), kNaN);
  return it->second;
}

namespace {

// One line of metrics.jsonl into `j`: an object with a numeric "iteration". False for a
// last line without its newline that does not parse (one still being written: the run is
// live; a warning says so); any other bad line is an InputError naming file and line.
bool parse_metrics_line(const std::string& line, const std::string& name, int64_t lineno, bool complete, json& j) {
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    if (!complete) {
      log::warn("{}:{}: incomplete last line ignored (the run may still be writing it)", name, lineno);
      return false;
    }
    throw_input("{}:{}: not valid JSON: {}", name, lineno, strip_json_prefix(e.what()));
  }
  if (!j.is_object())
    throw_input("{}:{}: expected one JSON object per line, got a JSON {}", name, lineno, j.type_name());
  auto it = j.find("iteration");
  if (it == j.end() || !it->is_number())
    throw_input("{}:{}: no numeric \"iteration\" key (each line is one logged iteration)", name, lineno);
  return true;
}

// A row's "moe_layers" (the trainer's record per MoE layer, app/train/run_reports.cpp).
std::vector<Metrics::MoeLayer> parse_moe_layers(const json& v, const std::string& name, int64_t lineno) {
  const auto bad = [&] {
    throw_input(
        "{}:{}: moe_layers: expected an array of objects with a numeric \"layer\" and \"tokens_per_expert\" an "
        "array of numbers",
        name, lineno);
  };
  if (!v.is_array()) bad();
  std::vector<Metrics::MoeLayer> out;
  for (const auto& l : v) {
    if (!l.is_object() || !l.contains("layer") || !l["layer"].is_number() || !l.contains("tokens_per_expert") ||
        !l["tokens_per_expert"].is_array())
      bad();
    Metrics::MoeLayer x;
    x.layer = l["layer"].get<int64_t>();
    for (const auto& t : l["tokens_per_expert"]) {
      if (!t.is_number()) bad();
      x.tokens.push_back(t.get<double>());
    }
    const auto number = [&](const char* k) { return l.contains(k) && l[k].is_number() ? l[k].get<double>() : kNaN; };
    x.min_over_mean = number("min_over_mean");
    x.max_over_mean = number("max_over_mean");
    x.dropped = l.contains("dropped") && l["dropped"].is_number() ? l["dropped"].get<int64_t>() : 0;
    out.push_back(std::move(x));
  }
  return out;
}

struct MetricsRow {
  double iteration;
  std::map<std::string, double> values;
  std::vector<Metrics::MoeLayer> moe;
};

// The row's scalar columns (numbers and booleans; anything else is NaN), and its MoE
// layers; new keys are appended to m.keys.
MetricsRow metrics_row(const json& j, const std::string& name, int64_t lineno, Metrics& m,
                       std::set<std::string>& seen_keys) {
  MetricsRow r{j["iteration"].get<double>(), {}, {}};
  for (auto& [k, v] : j.items()) {
    if (k == "moe_layers") {  // nested: not a column
      r.moe = parse_moe_layers(v, name, lineno);
      continue;
    }
    double d = kNaN;
    if (v.is_number())
      d = v.get<double>();
    else if (v.is_boolean())
      d = v.get<bool>() ? 1.0 : 0.0;
    r.values[k] = std::isfinite(d) ? d : kNaN;
    if (seen_keys.insert(k).second) m.keys.push_back(k);
  }
  return r;
}

// The kept rows as columns (and MoE layers).
void fill_columns(Metrics& m, const std::vector<MetricsRow>& rows) {
  m.rows = static_cast<int64_t>(rows.size());
  for (const auto& k : m.keys) {
    auto& col = m.columns[k];
    col.assign(rows.size(), kNaN);
    for (size_t i = 0; i < rows.size(); ++i) {
      auto f = rows[i].values.find(k);
      if (f != rows[i].values.end()) col[i] = f->second;
    }
  }
  if (std::any_of(rows.begin(), rows.end(), [](const MetricsRow& r) { return !r.moe.empty(); }))
    for (const auto& r : rows) m.moe.push_back(r.moe);
}

}  // namespace

Metrics read_metrics(const fs::path& file) {
  const std::string name = file.string();
  std::error_code ec;
  if (!fs::exists(file, ec))
    throw_input("{}: not found (mtnlg train writes metrics.jsonl into logging.dir; pass a run directory)", name);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw_input("{}: cannot be opened for reading", name);

  Metrics m;
  m.source = name;
  std::vector<MetricsRow> rows;
  std::set<std::string> seen_keys;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const bool complete = !in.eof();  // getline stopped at a newline, not at end of file
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    json j;
    if (!parse_metrics_line(line, name, lineno, complete, j)) break;
    auto it = j.find("iteration");
    auto number = [&](const char* k) {
      auto f = j.find(k);
      return f != j.end() && f->is_number() ? f->get<double>() : kNaN;
    };
    if (j.contains("validation_loss") || j.contains("test_loss")) {
      const bool test = j.contains("test_loss");
      m.held_out.push_back({it->get<double>(), test, number(test ? "test_loss" : "validation_loss"),
                            number(test ? "test_ppl" : "validation_ppl")});
      continue;
    }
    MetricsRow r = metrics_row(j, name, lineno, m, seen_keys);
    // A resumed run appends from its checkpoint's iteration on: the new rows win.
    bool went_back = false;
    while (!rows.empty() && rows.back().iteration >= r.iteration) {
      rows.pop_back();
      went_back = true;
    }
    if (went_back) {
      ++m.restarts;
      // The abandoned run's validation points from the restart on are replaced too.
      std::erase_if(m.held_out, [&](const Metrics::HeldOut& h) { return h.iteration >= r.iteration; });
    }
    rows.push_back(std::move(r));
  }
  if (rows.empty()) throw_input("{}: no logged iterations (the run has not logged one yet)", name);
  fill_columns(m, rows);
  return m;
}

// ---------------------------------------------------------------------------------
// Numbers and text
// ---------------------------------------------------------------------------------

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f < 1.5 ? 1.0 : f < 3.0 ? 2.0 : f < 7.0 ? 5.0 : 10.0) * mag;
  std::vector<double> ticks;
  // Integer multiples of step, so no error accumulates from repeated addition.
  const double k0 = std::ceil(lo / step - 1e-9), k1 = std::floor(hi / step + 1e-9);
  for (double k = k0; k <= k1; k += 1.0) {
    double t = k * step;
    if (std::fabs(t) < step * 1e-9) t = 0.0;  // no "-0" or "1e-20" for zero
    ticks.push_back(t);
  }
  return ticks;
}

std::string format_number(double v) {
  if (!std::isfinite(v)) return "n/a";
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e3 && a < 1e15) {
    static const char* suffix[] = {"K", "M", "B", "T"};
    int i = a >= 1e12 ? 3 : a >= 1e9 ? 2 : a >= 1e6 ? 1 : 0;
    double x = v / std::pow(1e3, i + 1);
    // 999.95K rounds to "1e+03K" with 3 significant digits: move up a suffix instead.
    if (std::fabs(x) >= 999.5 && i < 3) {
      ++i;
      x /= 1e3;
    }
    return fmt::format("{:.3g}{}", x, suffix[i]);
  }
  if (a >= 1e-3 && a < 1e15) return fmt::format("{:.4g}", v);
  // Tiny (learning rates) or huge: always "2.5e-4", never "0.00025" beside "5e-5", so
  // the tick labels of one axis read alike.
  const std::string e = fmt::format("{:.2e}", v);  // "-2.50e-04"
  const auto epos = e.find('e');
  std::string mant = e.substr(0, epos);
  while (mant.back() == '0') mant.pop_back();
  if (mant.back() == '.') mant.pop_back();
  return fmt::format("{}e{}", mant, std::stoi(e.substr(epos + 1)));
}

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes)) return "n/a";
  static const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (std::fabs(bytes) >= 1024 && i < 5) {
    bytes /= 1024;
    ++i;
  }
  return i == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.3g} {}", bytes, unit[i]);
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------
// SVG plot
// ---------------------------------------------------------------------------------

namespace {

struct Pt {
  double x, y;
};

// Keeps the first, min, max and last point of each pixel column (in index order), so a
// 100k-iteration run draws ~4 points per pixel and spikes survive.
std::vector<Pt> thin(const std::vector<Pt>& pts, double plot_width) {
  if (pts.size() <= static_cast<size_t>(4 * plot_width)) return pts;
  std::vector<Pt> out;
  size_t i = 0;
  while (i < pts.size()) {
    const long col = std::lround(std::floor(pts[i].x));
    size_t j = i, lo = i, hi = i;
    while (j < pts.size() && std::lround(std::floor(pts[j].x)) == col) {
      if (pts[j].y < pts[lo].y) lo = j;
      if (pts[j].y > pts[hi].y) hi = j;
      ++j;
    }
    std::vector<size_t> keep = {i, lo, hi, j - 1};
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    for (size_t k : keep) out.push_back(pts[k]);
    i = j;
  }
  return out;
}

}  // namespace

namespace {

// A plot's drawing area (pixels) and data window, and the mapping between them.
struct PlotFrame {
  double W, H, px0, px1, py0, py1;
  double xlo, xhi, ylo, yhi;
  double sx(double x) const { return px0 + (x - xlo) / (xhi - xlo) * (px1 - px0); }
  double sy(double y) const { return py1 - (y - ylo) / (yhi - ylo) * (py1 - py0); }
};

// The frame of a spec: margins, and the data ranges over finite values only (NaN when
// the plot has no finite point).
PlotFrame plot_frame(const PlotSpec& spec) {
  PlotFrame f{};
  f.W = spec.width;
  f.H = spec.height;
  const double ml = 74, mr = 18, mt = 34, mb = 50;
  f.px0 = ml, f.px1 = f.W - mr, f.py0 = mt, f.py1 = f.H - mb;
  f.xlo = min_finite(spec.x), f.xhi = max_finite(spec.x);
  f.ylo = kNaN, f.yhi = kNaN;
  for (const auto& s : spec.series)
    for (size_t i = 0; i < s.y.size() && i < spec.x.size(); ++i) {
      const double y = s.y[i] * spec.y_scale;
      if (!std::isfinite(y) || !std::isfinite(spec.x[i])) continue;
      if (!(y >= f.ylo)) f.ylo = y;
      if (!(y <= f.yhi)) f.yhi = y;
    }
  return f;
}

// Degenerate ranges (one point, a constant series) get a symmetric pad so the data
// sits mid-plot instead of dividing by zero; others 5% of y.
void pad_ranges(PlotFrame& f) {
  double &xlo = f.xlo, &xhi = f.xhi, &ylo = f.ylo, &yhi = f.yhi;
  if (xhi == xlo) {
    const double d = xlo != 0 ? std::fabs(xlo) * 0.05 : 1.0;
    xlo -= d;
    xhi += d;
  }
  if (yhi == ylo) {
    const double d = ylo != 0 ? std::fabs(ylo) * 0.1 : 1.0;
    ylo -= d;
    yhi += d;
  } else {
    const double pad = (yhi - ylo) * 0.05;
    // Keep a non-negative quantity's axis from dipping below zero just for padding.
    ylo = (ylo >= 0 && ylo - pad < 0) ? 0.0 : ylo - pad;
    yhi += pad;
  }
}

// The svg element, background, title, axis lines and axis labels.
void write_plot_frame(std::ostream& o, const PlotSpec& spec, const PlotFrame& f) {
  const double W = f.W, H = f.H, px0 = f.px0, px1 = f.px1, py0 = f.py0, py1 = f.py1;
  o << fmt::format(
      "<svg class=\"plot\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\" "
      "font-family=\"Helvetica, Arial, sans-serif\">\n",
      spec.width, spec.height, html_escape(spec.title));
  o << fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", spec.width, spec.height);
  o << fmt::format(
      "<text class=\"title\" x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"600\" "
      "fill=\"#222\">{}</text>\n",
      fmt_coord(W / 2), html_escape(spec.title));

  // Axis lines and labels are drawn even without data, so an empty plot still reads as one.
  o << fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\"/>\n", px0, py0, py1);
  o << fmt::format("<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"#444\"/>\n", px0, px1, py1);
  o << fmt::format(
      "<text class=\"xlabel\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\" fill=\"#333\">{}</text>\n",
      fmt_coord((px0 + px1) / 2), fmt_coord(H - 10), html_escape(spec.x_label));
  o << fmt::format(
      "<text class=\"ylabel\" transform=\"rotate(-90)\" x=\"{}\" y=\"16\" text-anchor=\"middle\" font-size=\"12\" "
      "fill=\"#333\">{}</text>\n",
      fmt_coord(-(py0 + py1) / 2), html_escape(spec.y_label));
}

void write_ticks(std::ostream& o, const PlotFrame& f) {
  const double px0 = f.px0, px1 = f.px1, py1 = f.py1;
  auto sx = [&](double x) { return f.sx(x); };
  auto sy = [&](double y) { return f.sy(y); };
  const double xlo = f.xlo, xhi = f.xhi, ylo = f.ylo, yhi = f.yhi;
  for (double t : nice_ticks(ylo, yhi, 5)) {
    const double y = sy(t);
    o << fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e6e6e6\"/>\n", px0 + 1,
                     fmt_coord(y), px1, fmt_coord(y));
    o << fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/>\n", px0 - 5, fmt_coord(y), px0,
                     fmt_coord(y));
    o << fmt::format(
        "<text class=\"ytick\" x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"11\" fill=\"#444\">{}</text>\n",
        px0 - 8, fmt_coord(y + 4), format_number(t));
  }
  for (double t : nice_ticks(xlo, xhi, 6)) {
    const double x = sx(t);
    o << fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\"/>\n", fmt_coord(x), py1,
                     py1 + 5);
    o << fmt::format(
        "<text class=\"xtick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\" fill=\"#444\">{}</text>\n",
        fmt_coord(x), py1 + 18, format_number(t));
  }
}

void write_series(std::ostream& o, const PlotSpec& spec, const PlotFrame& f) {
  const double px0 = f.px0, px1 = f.px1;
  auto sx = [&](double x) { return f.sx(x); };
  auto sy = [&](double y) { return f.sy(y); };
  // Series: one polyline per run of finite points.
  for (const auto& s : spec.series) {
    std::vector<std::vector<Pt>> runs(1);
    for (size_t i = 0; i < spec.x.size() && i < s.y.size(); ++i) {
      const double y = s.y[i] * spec.y_scale;
      if (std::isfinite(y) && std::isfinite(spec.x[i])) {
        runs.back().push_back({sx(spec.x[i]), sy(y)});
      } else if (!runs.back().empty()) {
        runs.emplace_back();
      }
    }
    for (const auto& run : runs) {
      if (run.empty()) continue;
      if (run.size() == 1) {
        o << fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>\n", fmt_coord(run[0].x),
                         fmt_coord(run[0].y), s.colour);
        continue;
      }
      o << "<polyline fill=\"none\" stroke=\"" << s.colour
        << "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"";
      bool first = true;
      for (const auto& p : thin(run, px1 - px0)) {
        o << (first ? "" : " ") << fmt_coord(p.x) << ',' << fmt_coord(p.y);
        first = false;
      }
      o << "\"/>\n";
    }
  }
}

// Returns the pixel columns marked.
std::set<long> write_marks(std::ostream& o, const PlotSpec& spec, const PlotFrame& f) {
  const double py1 = f.py1;
  auto sx = [&](double x) { return f.sx(x); };
  // Marks (e.g. iterations whose loss was not finite) as red ticks rising from the x axis.
  std::set<long> mark_cols;
  for (double mx : spec.marks_x) {
    if (!std::isfinite(mx)) continue;
    const double x = sx(mx);
    if (!mark_cols.insert(std::lround(x)).second) continue;
    o << fmt::format(
        "<line class=\"mark\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#d62728\" "
        "stroke-width=\"2\"/>\n",
        fmt_coord(x), py1, py1 - 10);
  }

  return mark_cols;
}

void write_legend(std::ostream& o, const PlotSpec& spec, const PlotFrame& f, const std::set<long>& mark_cols) {
  const double px1 = f.px1, py0 = f.py0;
  // Legend, top right inside the plot, only when it tells something the title does not.
  std::vector<std::pair<std::string, std::string>> legend;
  if (spec.series.size() > 1)
    for (const auto& s : spec.series) legend.emplace_back(s.name, s.colour);
  if (!mark_cols.empty()) {
    if (spec.series.size() == 1) legend.emplace_back(spec.series[0].name, spec.series[0].colour);
    legend.emplace_back(spec.marks_label.empty() ? "marked" : spec.marks_label, "#d62728");
  }
  double ly = py0 + 12;
  for (const auto& [label, colour] : legend) {
    o << fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>\n", px1 - 150,
                     fmt_coord(ly - 4), px1 - 134, fmt_coord(ly - 4), colour);
    o << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#333\">{}</text>\n", px1 - 130, fmt_coord(ly),
                     html_escape(label));
    ly += 15;
  }
}

}  // namespace

std::string render_svg_plot(const PlotSpec& spec) {
  PlotFrame f = plot_frame(spec);
  std::ostringstream o;
  write_plot_frame(o, spec, f);
  if (!(std::isfinite(f.xlo) && std::isfinite(f.ylo))) {
    o << fmt::format(
        "<text class=\"nodata\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\" fill=\"#888\">no finite "
        "values logged</text>\n</svg>\n",
        fmt_coord((f.px0 + f.px1) / 2), fmt_coord((f.py0 + f.py1) / 2));
    return o.str();
  }
  pad_ranges(f);
  write_ticks(o, f);
  write_series(o, spec, f);
  const std::set<long> mark_cols = write_marks(o, spec, f);
  write_legend(o, spec, f, mark_cols);
  o << "</svg>\n";
  return o.str();
}

// ---------------------------------------------------------------------------------
// Eval results
// ---------------------------------------------------------------------------------

std::vector<EvalRow> read_eval_results(const fs::path& run_dir) {
  std::vector<fs::path> files;
  for (const fs::path& d : {run_dir, run_dir / "eval"}) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<EvalRow> rows;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("results") || !j["results"].is_object()) continue;
    const std::string rel = fs::relative(f, run_dir).string();
    for (auto& [task, metrics] : j["results"].items()) {
      if (!metrics.is_object()) continue;
      for (auto& [metric, value] : metrics.items()) {
        if (!value.is_number() || metric.ends_with("_stderr")) continue;
        EvalRow r{rel, task, metric, value.get<double>(), -1};
        auto se = metrics.find(metric + "_stderr");
        if (se != metrics.end() && se->is_number()) r.stderr_ = se->get<double>();
        rows.push_back(std::move(r));
      }
    }
  }
  return rows;
}

// ---------------------------------------------------------------------------------
// The page
// ---------------------------------------------------------------------------------

namespace {

const char* kStyle = R"(
body { font-family: Helvetica, Arial, sans-serif; color: #222; background: #fafafa; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 16px 20px 40px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 17px; margin: 26px 0 10px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; font-size: 13px; margin: 0 0 12px; }
.plots { display: flex; flex-wrap: wrap; gap: 14px; }
svg.plot { background: #fff; border: 1px solid #ddd; border-radius: 4px; }
table { border-collapse: collapse; font-size: 13px; background: #fff; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; }
pre { background: #fff; border: 1px solid #ddd; padding: 10px; font-size: 12px; overflow-x: auto; }
.note { color: #666; font-size: 13px; }
.bar { background: #1f77b4; height: 10px; display: inline-block; vertical-align: middle; }
)";

struct PlotDef {
  const char* key;
  const char* title;
  const char* y_label;
  double scale;
  const char* colour;
  bool always;  // drawn even when the column is missing (shows "no finite values")
};

}  // namespace

namespace {

// One plot per logged metric (defs), against consumed tokens (or iterations); the
// metrics a run did not log are named in not_logged.
std::string training_plots(const Metrics& m, const std::vector<double>& x, const std::string& x_label,
                           std::vector<std::string>& not_logged, int64_t& nplots) {
  static const PlotDef defs[] = {
      {"loss", "Training loss", "loss (nats/token)", 1.0, "#1f77b4", true},
      {"lr", "Learning rate", "learning rate", 1.0, "#ff7f0e", false},
      {"global_batch_size", "Global batch size", "sequences", 1.0, "#2ca02c", false},
      {"tokens_per_s", "Throughput", "tokens / s", 1.0, "#9467bd", false},
      {"tflops_per_gpu", "TFLOP/s per GPU", "TFLOP/s", 1.0, "#8c564b", false},
      {"mfu", "Model FLOPs utilisation", "MFU (%)", 100.0, "#e377c2", false},
      {"grad_norm", "Gradient norm", "global L2 norm", 1.0, "#7f7f7f", false},
      {"loss_scale", "Loss scale (fp16)", "loss scale", 1.0, "#bcbd22", false},
      {"step_time_s", "Iteration time", "seconds", 1.0, "#17becf", false},
      {"peak_memory_bytes", "Peak memory", "GiB", 1.0 / (1024.0 * 1024 * 1024), "#393b79", false},
  };
  std::string plots;
  for (const auto& d : defs) {
    const bool present = m.has(d.key);
    if (!present && !d.always) {
      // loss_scale is fp16-only and memory is 0 on the CPU: absent is normal there.
      if (std::string_view(d.key) != "loss_scale" && std::string_view(d.key) != "peak_memory_bytes")
        not_logged.push_back(d.key);
      continue;
    }
    const std::vector<double> y = m.column(d.key);
    if (std::string_view(d.key) == "peak_memory_bytes" && !(max_finite(y) > 0)) continue;
    PlotSpec p;
    p.title = d.title;
    p.x_label = x_label;
    p.y_label = d.y_label;
    p.x = x;
    p.series.push_back({d.key, y, d.colour});
    p.y_scale = d.scale;
    if (std::string_view(d.key) == "loss") {
      // Rows whose loss was logged as null (non-finite) are where training went wrong.
      for (int64_t i = 0; i < m.rows; ++i)
        if (!std::isfinite(y[i])) p.marks_x.push_back(x[i]);
      p.marks_label = "non-finite loss";
    }
    plots += render_svg_plot(p);
    ++nplots;
  }
  return plots;
}

// Validation (every eval_interval and at the end) and test loss, by iteration; the
// run must have logged held-out losses.
std::string held_out_plot(const Metrics& m) {
  std::vector<double> hx;
  for (const auto& h : m.held_out)
    if (hx.empty() || h.iteration > hx.back()) hx.push_back(h.iteration);
  std::vector<double> vy(hx.size(), kNaN), ty(hx.size(), kNaN);
  for (const auto& h : m.held_out) {
    const size_t i = static_cast<size_t>(std::lower_bound(hx.begin(), hx.end(), h.iteration) - hx.begin());
    if (i < hx.size() && hx[i] == h.iteration) (h.test ? ty : vy)[i] = h.loss;  // the later record wins
  }
  PlotSpec p;
  p.title = "Validation loss";
  p.x_label = "iteration";
  p.y_label = "loss (nats/token)";
  p.x = hx;
  p.series.push_back({"validation loss", vy, "#d62728"});
  if (std::any_of(ty.begin(), ty.end(), [](double y) { return std::isfinite(y); }))
    p.series.push_back({"test loss", ty, "#2ca02c"});
  return render_svg_plot(p);
}

// Straggler detection's rows (logging.straggler_margin): each rank named in a
// `straggler_rank` row with the logged iterations it stayed named at, as ranges
// ("rank 2 at iterations 4-10"); "none" when detection ran and named nobody.
std::string straggler_text(const Metrics& m) {
  const auto iter = m.column("iteration");
  const auto flagged = m.column("straggler_rank");
  std::map<int64_t, std::vector<std::pair<double, double>>> ranges;  // rank -> [first, last] runs
  double prev_rank = kNaN;
  for (size_t i = 0; i < flagged.size(); ++i) {
    if (std::isfinite(flagged[i])) {
      auto& v = ranges[static_cast<int64_t>(flagged[i])];
      if (flagged[i] == prev_rank && !v.empty())
        v.back().second = iter[i];
      else
        v.push_back({iter[i], iter[i]});
    }
    prev_rank = flagged[i];
  }
  if (ranges.empty()) return "none";
  std::string out;
  for (const auto& [rank, runs] : ranges) {
    if (!out.empty()) out += "; ";
    out += fmt::format("rank {} at iteration{} ", rank, runs.size() > 1 || runs[0].first != runs[0].second ? "s" : "");
    for (size_t k = 0; k < runs.size(); ++k) {
      if (k) out += ", ";
      out += format_number(runs[k].first);
      if (runs[k].second != runs[k].first) {
        out += '-';  // not "-" + ...: GCC 12 -Wrestrict false positive (PR105651)
        out += format_number(runs[k].second);
      }
    }
  }
  return out;
}

// Spike and NaN forensics' events (RUN_DIR/forensics.jsonl, written by the trainer): one
// piece each, "iteration 12: loss spike, persistent: sample 45 (source 1, documents 37),
// skip"; "" when the file is absent (forensics off or nothing found).
std::string forensics_text(const fs::path& run_dir) {
  std::ifstream in(run_dir / "forensics.jsonl");
  std::string out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    std::string who;
    for (const auto& q : j.value("ranks", nlohmann::json::array()))
      who += fmt::format("{}rank {}", who.empty() ? "" : ", ", q.value("rank", int64_t{-1}));
    for (const auto& sm : j.value("samples", nlohmann::json::array())) {
      std::string docs;
      for (const auto& d : sm.value("documents", nlohmann::json::array())) {
        if (!docs.empty()) docs += ',';
        docs += std::to_string(d.get<int64_t>());
      }
      who +=
          fmt::format("{}sample {} (source {}, documents {})", who.empty() ? "" : ", ", sm.value("sample", int64_t{-1}),
                      sm.value("source_name", std::string()), docs.empty() ? "-" : docs);
    }
    if (!out.empty()) out += "; ";
    out +=
        fmt::format("iteration {}: {}, {}{}{}, {}", j.value("iteration", int64_t{0}), j.value("trigger", std::string()),
                    j.value("verdict", std::string()), who.empty() ? "" : ": ", who, j.value("action", std::string()));
  }
  return out;
}

// The summary table's rows.
std::vector<std::pair<std::string, std::string>> summary_facts(const Metrics& m, const fs::path& run_dir) {
  const auto iter = m.column("iteration");
  std::vector<std::pair<std::string, std::string>> facts;
  auto tail = [&](const std::string& key) {
    auto c = m.column(key);
    if (c.size() > 1) c.erase(c.begin());  // the first iteration includes warm-up
    return c;
  };
  facts.reserve(20);  // also keeps GCC 12's -Warray-bounds false positive on the first emplace quiet
  facts.emplace_back("Run directory", run_dir.string());
  facts.emplace_back("Logged iterations",
                     fmt::format("{} ({} to {})", m.rows, format_number(iter.front()), format_number(iter.back())));
  if (m.restarts > 0) facts.emplace_back("Restarts (resumed from a checkpoint)", std::to_string(m.restarts));
  if (m.has("consumed_tokens"))
    facts.emplace_back("Consumed tokens", format_number(last_finite(m.column("consumed_tokens"))));
  if (m.has("consumed_samples"))
    facts.emplace_back("Consumed samples", format_number(last_finite(m.column("consumed_samples"))));
  facts.emplace_back("Last finite loss", format_number(last_finite(m.column("loss"))));
  facts.emplace_back("Lowest loss", format_number(min_finite(m.column("loss"))));
  for (bool test : {false, true})
    for (auto h = m.held_out.rbegin(); h != m.held_out.rend(); ++h)
      if (h->test == test) {
        facts.emplace_back(
            fmt::format("{} loss (iteration {})", test ? "Test" : "Last validation", format_number(h->iteration)),
            fmt::format("{} (PPL {})", format_number(h->loss), format_number(h->ppl)));
        break;
      }
  if (m.has("tokens_per_s")) facts.emplace_back("Median tokens/s", format_number(median_of(tail("tokens_per_s"))));
  if (m.has("tflops_per_gpu"))
    facts.emplace_back("Median TFLOP/s per GPU", format_number(median_of(tail("tflops_per_gpu"))));
  if (m.has("mfu")) facts.emplace_back("Median MFU", fmt::format("{:.1f}%", 100 * median_of(tail("mfu"))));
  if (m.has("step_time_s"))
    facts.emplace_back("Median iteration time", format_number(median_of(tail("step_time_s"))) + " s");
  if (m.has("skipped")) facts.emplace_back("Skipped iterations", format_number(last_finite(m.column("skipped"))));
  if (m.has("nan_iterations"))
    facts.emplace_back("Non-finite iterations", format_number(last_finite(m.column("nan_iterations"))));
  if (m.has("slowest_rank")) facts.emplace_back("Stragglers flagged", straggler_text(m));
  if (const std::string f = forensics_text(run_dir); !f.empty())
    facts.emplace_back("Spikes and NaNs (forensics)", f);
  else if (m.has("anomalies"))
    facts.emplace_back("Spikes and NaNs (forensics)", "none");
  if (max_finite(m.column("peak_memory_bytes")) > 0)
    facts.emplace_back("Peak memory", format_bytes(max_finite(m.column("peak_memory_bytes"))));
  for (const char* k : {"bytes_sent_tp", "bytes_sent_pp", "bytes_sent_dp"})
    if (m.has(k))
      facts.emplace_back(fmt::format("Bytes sent ({})", std::string_view(k).substr(11)),
                         format_bytes(last_finite(m.column(k))));
  return facts;
}

void write_eval_table(std::ostream& h, const std::vector<EvalRow>& evals) {
  if (evals.empty()) {
    h << "<p class=\"note\">No eval results in this directory (mtnlg eval --output RUN_DIR/NAME.json puts them "
         "here).</p>\n";
  } else {
    h << "<table class=\"eval\">\n<tr><th>file</th><th>task</th><th>metric</th><th>value</th><th>stderr</th></tr>\n";
    for (const auto& r : evals)
      h << "<tr><td>" << html_escape(r.file) << "</td><td>" << html_escape(r.task) << "</td><td>"
        << html_escape(r.metric) << "</td><td class=\"num\">" << fmt::format("{:.4f}", r.value)
        << "</td><td class=\"num\">" << (r.stderr_ >= 0 ? fmt::format("&plusmn; {:.4f}", r.stderr_) : "")
        << "</td></tr>\n";
    h << "</table>\n";
  }
}

void write_recipe(std::ostream& h, const fs::path& run_dir) {
  const fs::path recipe = run_dir / "recipe.resolved.yaml";
  std::ifstream rin(recipe, std::ios::binary);
  if (rin) {
    std::stringstream ss;
    ss << rin.rdbuf();
    h << "<pre class=\"recipe\">" << html_escape(ss.str()) << "</pre>\n";
  } else {
    h << "<p class=\"note\">" << html_escape(recipe.string()) << " not found.</p>\n";
  }
}

// The page's name: the directory's own name (its parent's for ".").
std::string page_title(const fs::path& dir) {
  std::string title = dir.filename().string();
  if (title.empty() || title == ".") title = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  return title;
}

void write_page_head(std::ostream& h, const std::string& title) {
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>mtnlg report: " << html_escape(title) << "</title>\n<style>" << kStyle
    << "</style>\n</head>\n<body>\n<main>\n";
}

// The corpus funnel of `mtnlg data curate` (curate_report.json in its work_dir): per
// source, documents and text bytes into and out of every stage, with the share of the
// source's documents still there as a bar, tokens after tokenizing; then the blend
// (tokens, weight, epochs).
// Returns the funnel rows written (0 when the directory holds no curation report).
int64_t write_curation(std::ostream& h, const fs::path& dir) {
  const fs::path file = dir / "curate_report.json";
  std::error_code ec;
  if (!fs::exists(file, ec)) return 0;
  std::ifstream in(file, std::ios::binary);
  json rep;
  try {
    rep = json::parse(in);
  } catch (const json::exception& e) {
    throw_input("{}: not valid JSON ({})", file.string(), e.what());
  }
  if (!rep.contains("funnel") || !rep["funnel"].is_object() || !rep.contains("blend") || !rep["blend"].is_array())
    throw_input("{}: no funnel or blend (written by mtnlg data curate?)", file.string());
  auto cell = [](const json& v) { return v.is_number() ? format_number(v.get<double>()) : std::string("&ndash;"); };
  int64_t rows = 0;
  h << "<h2>Corpus funnel</h2>\n<p class=\"sub\">" << html_escape(rep.value("pipeline", std::string())) << "</p>\n";
  h << "<table class=\"funnel\">\n<tr><th>source</th><th>stage</th><th>documents in</th><th>documents out</th>"
       "<th>kept of the source</th><th>text bytes in</th><th>text bytes out</th><th>tokens out</th></tr>\n";
  for (const auto& [src, stages] : rep["funnel"].items()) {
    double first = -1;
    for (const auto& e : stages) {
      const json& din = e["documents_in"];
      const json& dout = e["documents_out"];
      if (first < 0 && din.is_number()) first = din.get<double>();
      const double share = first > 0 && dout.is_number() ? dout.get<double>() / first : 0.0;
      h << "<tr><td>" << html_escape(src) << "</td><td>" << html_escape(e.value("stage", std::string()))
        << "</td><td class=\"num\">" << cell(din) << "</td><td class=\"num\">" << cell(dout)
        << "</td><td><span class=\"bar\" style=\"width:" << fmt::format("{:.0f}", 120 * std::min(1.0, share))
        << "px\"></span> " << fmt::format("{:.1f}%", 100 * share) << "</td><td class=\"num\">"
        << cell(e["text_bytes_in"]) << "</td><td class=\"num\">" << cell(e["text_bytes_out"])
        << "</td><td class=\"num\">" << cell(e.value("tokens_out", json())) << "</td></tr>\n";
      ++rows;
    }
  }
  h << "</table>\n<h2>Blend</h2>\n<table "
       "class=\"blend\">\n<tr><th>source</th><th>tokens</th><th>weight</th><th>epochs</th></tr>\n";
  for (const auto& r : rep["blend"])
    h << "<tr><td>" << html_escape(r.value("source", std::string())) << "</td><td class=\"num\">" << cell(r["tokens"])
      << "</td><td class=\"num\">" << fmt::format("{:.4f}", r.value("weight", 0.0)) << "</td><td class=\"num\">"
      << fmt::format("{:.3f}", r.value("epochs", 0.0)) << "</td></tr>\n";
  h << "</table>\n<p class=\"note\">Training tokens the epochs are computed for: "
    << cell(rep.value("train_tokens", json())) << ".</p>\n";
  return rows;
}

// A directory of `mtnlg data curate` without a training run: the funnel page alone.
std::string render_curation_page(const fs::path& dir, ReportSummary* summary) {
  const std::string title = page_title(dir);
  std::ostringstream h;
  write_page_head(h, title);
  h << "<h1>Corpus curation: " << html_escape(title) << "</h1>\n";
  h << "<p class=\"sub\">" << html_escape((dir / "curate_report.json").string()) << " &middot; mtnlg " << MTNLG_VERSION
    << "</p>\n";
  const int64_t rows = write_curation(h, dir);
  h << "</main>\n</body>\n</html>\n";
  if (summary) summary->funnel_rows = rows;
  return h.str();
}

}  // namespace

std::string render_report_html(const fs::path& run_dir, ReportSummary* summary, const ExplainOptions& explain) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw_input("{}: not a directory (pass the run's logging.dir, e.g. runs/cpu-demo)", run_dir.string());
  if (!fs::exists(run_dir / "metrics.jsonl", ec) && fs::exists(run_dir / "curate_report.json", ec))
    return render_curation_page(run_dir, summary);
  const Metrics m = read_metrics(run_dir / "metrics.jsonl");

  // x axis: consumed tokens (the schedules run on tokens and batch sizes ramp, so
  // iterations are not comparable across runs); iterations if tokens were not logged.
  const bool by_tokens = m.has("consumed_tokens");
  const std::vector<double> x = m.column(by_tokens ? "consumed_tokens" : "iteration");
  const std::string x_label = by_tokens ? "consumed tokens" : "iteration";
  std::vector<std::string> not_logged;
  int64_t nplots = 0;
  std::string plots = training_plots(m, x, x_label, not_logged, nplots);
  if (!m.held_out.empty()) {
    plots += held_out_plot(m);
    ++nplots;
  }
  const auto facts = summary_facts(m, run_dir);
  const auto evals = read_eval_results(run_dir);
  const std::string title = page_title(run_dir);

  std::ostringstream h;
  write_page_head(h, title);
  h << "<h1>Training run: " << html_escape(title) << "</h1>\n";
  h << "<p class=\"sub\">" << html_escape(m.source) << " &middot; x axis: " << x_label << " &middot; mtnlg "
    << MTNLG_VERSION << "</p>\n";
  h << "<h2>Summary</h2>\n<table class=\"summary\">\n";
  for (const auto& [k, v] : facts) h << "<tr><th>" << html_escape(k) << "</th><td>" << html_escape(v) << "</td></tr>\n";
  h << "</table>\n";
  h << "<h2>Training curves</h2>\n<div class=\"plots\">\n" << plots << "</div>\n";
  h << moe_html_section(m, run_dir, x, x_label, nplots);  // MoE runs: losses, expert load, routing verdict
  h << explain_html_section(run_dir, explain);            // logging.step_timing: the parts against the plan
  if (!not_logged.empty()) {
    h << "<p class=\"note\">Not logged in this run: ";
    for (size_t i = 0; i < not_logged.size(); ++i) h << (i ? ", " : "") << html_escape(not_logged[i]);
    h << ".</p>\n";
  }
  h << "<h2>Evaluation results</h2>\n";
  write_eval_table(h, evals);
  const int64_t funnel_rows = write_curation(h, run_dir);  // a run directory that is also a curate work_dir
  h << "<h2>Resolved recipe</h2>\n";
  write_recipe(h, run_dir);
  h << "</main>\n</body>\n</html>\n";

  if (summary) {
    summary->iterations = m.rows;
    summary->plots = nplots;
    summary->eval_rows = static_cast<int64_t>(evals.size());
    summary->funnel_rows = funnel_rows;
  }
  return h.str();
}

ReportSummary write_report(const fs::path& run_dir, const fs::path& output, const ExplainOptions& explain) {
  ReportSummary s;
  const std::string html = render_report_html(run_dir, &s, explain);
  s.output = output.empty() ? run_dir / "report.html" : output;
  std::error_code ec;
  if (s.output.has_parent_path()) fs::create_directories(s.output.parent_path(), ec);
  write_file_atomic(s.output.string(), html);
  return s;
}

}  // namespace mtnlg::app::report
