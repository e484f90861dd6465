// `mtnlg report --explain` and the report page's "Where the time went" section: the
// measured step parts against the planner's, and the largest gaps in words.
#include "app/report/explain.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "planner/gpu_profile.hpp"
#include "app/report/moe_view.hpp"
#include "app/report/report.hpp"
#include "config/recipe.hpp"
#include "core/error.hpp"
#include "planner/cost_model.hpp"
#include "parallel/flight_recorder.hpp"

namespace mtnlg::app::report {

namespace fs = std::filesystem;
using timing::kStepParts;
using timing::StepPart;

double RankParts::total() const { return std::accumulate(s.begin(), s.end(), 0.0); }
double PlannedStage::total() const { return std::accumulate(s.begin(), s.end(), 0.0); }

namespace {

constexpr size_t idx(StepPart p) { return static_cast<size_t>(p); }
const char* label(size_t i) { return timing::step_part_label(static_cast<StepPart>(i)); }
const char* name(size_t i) { return timing::step_part_name(static_cast<StepPart>(i)); }

// Parts that are waiting on other ranks (or on the link): not a rank's own work.
bool is_wait(size_t i) {
  for (StepPart p : {StepPart::tp, StepPart::pp, StepPart::bubble, StepPart::dp, StepPart::embedding, StepPart::mp,
                     StepPart::cp, StepPart::host_sync})
    if (i == idx(p)) return true;
  return false;
}
double compute_of(const PartSeconds& s) {
  return s[idx(StepPart::forward)] + s[idx(StepPart::backward)] + s[idx(StepPart::recompute)];
}
double own_of(const PartSeconds& s) {
  double own = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (!is_wait(i)) own += s[i];
  return own;
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
std::string pct(double share) { return fmt::format("{:.0f}%", 100 * share); }
std::string ms(double s) { return fmt::format("{:.0f} ms", 1e3 * s); }
std::string rank_name(const RankParts& r) {
  return fmt::format("rank {} (tp {}, pp {}, dp {})", r.rank, r.tp, r.pp, r.dp);
}

// ---- measured ------------------------------------------------------------------------

struct Measured {
  std::vector<RankParts> ranks;
  int64_t records = 0, first = 0, last = 0, global_batch = 0;
  double dp_bytes = 0;
};

// Each rank's mean parts over the records with `key` (step_parts, or step_parts_gpu: the
// GPU's clock), the first left out when there are several (start-up). Throws InputError
// when there are no step_parts records.
Measured read_parts(const fs::path& run_dir, const std::string& key) {
  const fs::path file = run_dir / "metrics.jsonl";
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw_input("{}: not found (mtnlg train writes metrics.jsonl into logging.dir; pass a run directory)",
                file.string());
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"" + key + "\"") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains(key) && j[key].contains("ranks")) recs.push_back(std::move(j));
  }
  if (recs.empty())
    throw_input("{}: no step_parts records (the run was made with logging.step_timing: false or by an older mtnlg)",
                file.string());
  Measured m;
  const size_t from = recs.size() > 1 ? 1 : 0;
  for (size_t k = from; k < recs.size(); ++k) {
    const auto& rs = recs[k][key]["ranks"];
    if (m.ranks.size() < rs.size()) m.ranks.resize(rs.size());
    for (size_t r = 0; r < rs.size(); ++r) {
      auto& out = m.ranks[r];
      out.rank = rs[r].value("rank", int64_t(r));
      out.tp = rs[r].value("tp_rank", int64_t{0});
      out.pp = rs[r].value("pp_rank", int64_t{0});
      out.dp = rs[r].value("dp_rank", int64_t{0});
      for (size_t i = 0; i < kStepParts; ++i) out.s[i] += rs[r].value(name(i), 0.0) / double(recs.size() - from);
    }
  }
  m.records = static_cast<int64_t>(recs.size() - from);
  m.first = recs[from].value("iteration", int64_t{0});
  m.last = recs.back().value("iteration", int64_t{0});
  m.global_batch = recs.back().value("global_batch_size", int64_t{0});
  m.dp_bytes = recs.back().value("bytes_sent_dp", 0.0);
  return m;
}

// ---- planned -------------------------------------------------------------------------

// The estimate split into the step's parts per stage: m microbatches of each stage's
// forward and backward (the exposed tp share taken out of both; under full recompute a
// forward's worth of the backward is recompute), m point-to-point exchanges, the bubble
// (the pipeline phase less this stage's busy time), the dp reduction and the optimizer.
std::vector<PlannedStage> plan_stage_parts(const cost::Estimate& e) {
  std::vector<PlannedStage> out;
  const double m = double(e.microbatches);
  for (size_t st = 0; st < e.stage_times.size(); ++st) {
    const cost::StageTime& t = e.stage_times[st];
    PlannedStage p;
    p.stage = static_cast<int64_t>(st);
    const double fb = t.forward + t.backward;
    const double keep = fb > 0 ? 1.0 - t.tp_comm / fb : 1.0;
    const double fwd = m * t.forward * keep;
    p.s[idx(StepPart::forward)] = fwd;
    p.s[idx(StepPart::recompute)] = e.layout.recompute == RecomputeGranularity::full ? fwd : 0.0;
    p.s[idx(StepPart::backward)] = m * t.backward * keep - p.s[idx(StepPart::recompute)];
    p.s[idx(StepPart::tp)] = m * t.tp_comm;
    p.s[idx(StepPart::pp)] = m * t.p2p;
    p.s[idx(StepPart::bubble)] = std::max(0.0, e.pipeline_time - m * (fb + t.p2p));
    p.s[idx(StepPart::dp)] = e.dp_time;
    p.s[idx(StepPart::optimizer)] = e.optimizer_time;
    out.push_back(p);
  }
  return out;
}

// The planner's GPU or profile (a bad --gpu or profile file is the user's error: exit 2);
// a recipe the planner cannot read leaves the plan empty, with the reason in `source`.
std::vector<PlannedStage> make_plan(const fs::path& run_dir, const ExplainOptions& o, const Measured& m,
                                    std::string& source) {
  const int64_t world = static_cast<int64_t>(m.ranks.size());
  std::string profile = o.gpu_profile;
  if (profile.empty() && o.gpu.empty() && fs::exists(run_dir / "gpu-profile.json"))
    profile = (run_dir / "gpu-profile.json").string();
  const std::string gpu = o.gpu.empty() ? "cpu" : o.gpu;
  const cost::GpuSpec spec = profile.empty() ? cost::gpu_spec(gpu) : cost::load_gpu_profile(profile);
  const int64_t per_node = o.gpus_per_node > 0 ? o.gpus_per_node : (profile.empty() && gpu != "cpu" ? 8 : world);
  try {
    Recipe r = load_recipe((run_dir / "recipe.resolved.yaml").string());
    if (m.global_batch > 0) r.training.global_batch_size = m.global_batch;  // the batch the steps ran (ramp)
    const cost::Cluster c{spec, per_node, cost::software_profile("mtnlg")};
    const cost::Layout l = cost::layout_from_recipe(r, world);
    const cost::Estimate e = cost::estimate(r, l, c, {.with_run = false});
    source =
        fmt::format("planner: {}, {} microbatches of {}, software mtnlg, on {}{}: {:.3f} s per iteration", l.describe(),
                    e.microbatches, l.micro_batch, profile.empty() ? spec.name : "profile " + profile,
                    profile.empty() && gpu == "cpu"
                        ? " (uncalibrated; `mtnlg plan --calibrate RUN_DIR` writes RUN_DIR/gpu-profile.json, "
                          "which is then used)"
                        : "",
                    e.iteration_time);
    return plan_stage_parts(e);
  } catch (const std::exception& ex) {
    source = fmt::format("no plan: {}", ex.what());
    return {};
  }
}

}  // namespace

// ---- findings ------------------------------------------------------------------------

namespace {

struct Gaps {
  const std::vector<RankParts>& ranks;
  const std::vector<PlannedStage>& plan;
  std::vector<PartSeconds> stage_mean;  // measured, per pipeline stage: mean over its ranks
  std::vector<double> stage_total;
  double period = 0;                        // mean over ranks of the time per iteration
  double dp_bytes = 0;                      // rank 0's dp bytes per iteration
  std::array<bool, kStepParts> absorbed{};  // parts a cause finding already explains

  Gaps(const std::vector<RankParts>& r, const std::vector<PlannedStage>& p) : ranks(r), plan(p) {
    int64_t stages = 1;
    for (const auto& x : r) stages = std::max(stages, x.pp + 1);
    stage_mean.assign(static_cast<size_t>(stages), PartSeconds{});
    std::vector<int64_t> n(static_cast<size_t>(stages), 0);
    for (const auto& x : r) {
      ++n[static_cast<size_t>(x.pp)];
      for (size_t i = 0; i < kStepParts; ++i) stage_mean[static_cast<size_t>(x.pp)][i] += x.s[i];
      period += x.total() / double(r.size());
    }
    for (size_t s = 0; s < stage_mean.size(); ++s) {
      for (auto& v : stage_mean[s]) v /= double(std::max<int64_t>(1, n[s]));
      stage_total.push_back(std::accumulate(stage_mean[s].begin(), stage_mean[s].end(), 0.0));
    }
  }
  double planned_share(size_t stage, size_t part) const {
    if (stage >= plan.size() || plan[stage].total() <= 0) return 0.0;
    return plan[stage].s[part] / plan[stage].total();
  }
  double measured_share(size_t stage, size_t part) const {
    return stage_total[stage] > 0 ? stage_mean[stage][part] / stage_total[stage] : 0.0;
  }
  std::string expected(size_t stage, size_t part) const {
    return plan.empty() ? std::string(" (no plan to compare)")
                        : "; the plan expected " + pct(planned_share(stage, part));
  }
};

// The rank whose own work (everything but waiting) most exceeds the median of the other
// ranks of its pipeline stage, when by 20% and 5% of the step.
void slow_rank(Gaps& g, std::vector<Finding>& out) {
  const RankParts* worst = nullptr;
  double worst_excess = 0, worst_median = 0;
  for (const auto& r : g.ranks) {
    std::vector<double> peers;
    for (const auto& q : g.ranks)
      if (q.pp == r.pp && q.rank != r.rank) peers.push_back(own_of(q.s));
    if (peers.empty()) continue;
    const double med = median(peers), excess = own_of(r.s) - med;
    if (excess > worst_excess) worst = &r, worst_excess = excess, worst_median = med;
  }
  if (!worst || worst_excess < 0.05 * g.period || own_of(worst->s) < 1.2 * worst_median) return;
  size_t part = 0, wait = idx(StepPart::dp);
  double part_delta = -1, wait_s = -1;
  for (size_t i = 0; i < kStepParts; ++i) {
    std::vector<double> peer_i, others_i;
    for (const auto& q : g.ranks) {
      if (q.rank == worst->rank) continue;
      others_i.push_back(q.s[i]);
      if (q.pp == worst->pp) peer_i.push_back(q.s[i]);
    }
    const double d = worst->s[i] - median(peer_i);
    if (!is_wait(i) && d > part_delta) part = i, part_delta = d;
    const double w =
        std::accumulate(others_i.begin(), others_i.end(), 0.0) / double(std::max<size_t>(1, others_i.size()));
    if (is_wait(i) && w > wait_s) wait = i, wait_s = w;
  }
  out.push_back({worst_excess / g.period,
                 fmt::format("{} is slow: its own work takes {} per iteration against {} on the other ranks of its "
                             "stage ({} +{}); the others wait for it ({} {} of their step)",
                             rank_name(*worst), ms(own_of(worst->s)), ms(worst_median), label(part), ms(part_delta),
                             label(wait), pct(g.period > 0 ? wait_s / g.period : 0))});
  for (size_t i = 0; i < kStepParts; ++i)
    if (is_wait(i) || i == part) g.absorbed[i] = true;
}

// The pipeline stage that computes longest, when 25% longer than the lightest and by 5%
// of the step more than the stages' mean: the others wait for it in the bubble.
void stage_imbalance(Gaps& g, std::vector<Finding>& out) {
  const size_t n = g.stage_mean.size();
  if (n < 2) return;
  std::vector<double> c;
  for (const auto& s : g.stage_mean) c.push_back(compute_of(s));
  const size_t hi = static_cast<size_t>(std::max_element(c.begin(), c.end()) - c.begin());
  const size_t lo = static_cast<size_t>(std::min_element(c.begin(), c.end()) - c.begin());
  const double mean = std::accumulate(c.begin(), c.end(), 0.0) / double(n);
  const double loss = g.period > 0 ? (c[hi] - mean) / g.period : 0;
  if (c[lo] <= 0 || c[hi] < 1.25 * c[lo] || loss < 0.05) return;
  std::string planned;
  if (g.plan.size() == n && compute_of(g.plan[lo].s) > 0)
    planned = fmt::format("; the plan expected {:.1f}x", compute_of(g.plan[hi].s) / compute_of(g.plan[lo].s));
  const size_t bubble = idx(StepPart::bubble);
  const double bubble_gap = g.measured_share(lo, bubble) - g.planned_share(lo, bubble);
  out.push_back({std::max(loss, bubble_gap),
                 fmt::format("pipeline stage {} computes {} per iteration, {:.1f}x stage {} ({}){}; the other stages "
                             "wait for it: pipeline bubble {} of stage {}'s step{}",
                             hi, ms(c[hi]), c[hi] / c[lo], lo, ms(c[lo]), planned, pct(g.measured_share(lo, bubble)),
                             lo, g.expected(lo, bubble))});
  for (StepPart p : {StepPart::bubble, StepPart::pp, StepPart::forward, StepPart::backward, StepPart::recompute})
    g.absorbed[idx(p)] = true;
}

// The dp finding's cause: the rate its bytes moved at, against the rate the plan's dp
// time implies for the same bytes; whether every rank of the stage waits alike.
std::string dp_rates(const Gaps& g, size_t stage) {
  const size_t dp = idx(StepPart::dp);
  std::vector<double> t;
  for (const auto& r : g.ranks)
    if (static_cast<size_t>(r.pp) == stage) t.push_back(r.s[dp]);
  const double lo = *std::min_element(t.begin(), t.end()), hi = *std::max_element(t.begin(), t.end());
  std::string out = t.size() > 1 && lo > 0.8 * hi
                        ? ": every rank of the stage waits in it alike (the reduction is slow, not a late rank)"
                        : "";
  const double measured = g.stage_mean[stage][dp];
  if (g.dp_bytes <= 0 || measured <= 0) return out;
  out += fmt::format("{} rank 0 moves {} per iteration in it, {}/s", out.empty() ? ":" : ";", format_bytes(g.dp_bytes),
                     format_bytes(g.dp_bytes / measured));
  if (stage < g.plan.size() && g.plan[stage].s[dp] > 0)
    out += fmt::format(", where the plan assumed {}/s", format_bytes(g.dp_bytes / g.plan[stage].s[dp]));
  return out;
}

// Every part not yet explained whose share of some stage's step exceeds the plan's by 2
// points or more: the stage where it exceeds most.
void part_gaps(const Gaps& g, std::vector<Finding>& out) {
  for (size_t i = 0; i < kStepParts; ++i) {
    if (g.absorbed[i]) continue;
    size_t best = 0;
    double gap = -1;
    for (size_t s = 0; s < g.stage_mean.size(); ++s) {
      const double d = g.measured_share(s, i) - g.planned_share(s, i);
      if (d > gap) best = s, gap = d;
    }
    if (gap < 0.02) continue;
    out.push_back({gap, fmt::format("{} {} of the step{}{}{}", label(i), pct(g.measured_share(best, i)),
                                    g.stage_mean.size() > 1 ? fmt::format(" on pipeline stage {}", best) : "",
                                    g.expected(best, i), i == idx(StepPart::dp) ? dp_rates(g, best) : "")});
  }
}

}  // namespace

std::vector<Finding> find_gaps(const std::vector<RankParts>& ranks, const std::vector<PlannedStage>& plan,
                               double dp_bytes) {
  std::vector<Finding> out;
  if (ranks.empty()) return out;
  Gaps g(ranks, plan);
  g.dp_bytes = dp_bytes;
  if (g.period <= 0) return out;
  slow_rank(g, out);
  stage_imbalance(g, out);
  part_gaps(g, out);
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) { return a.size > b.size; });
  return out;
}

Explanation explain_run(const fs::path& run_dir, const ExplainOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw_input("{}: not a directory (pass the run's logging.dir, e.g. runs/cpu-demo)", run_dir.string());
  // A GPU run's own clock says where the GPU's time went; the host's only where the host
  // waited for it (mostly "host_sync" around asynchronous launches).
  Measured m;
  Explanation e;
  try {
    m = read_parts(run_dir, "step_parts_gpu");
    e.clock = "GPU";
  } catch (const InputError&) {
    m = read_parts(run_dir, "step_parts");
  }
  e.run_dir = run_dir.string();
  e.records = m.records;
  e.first_iteration = m.first;
  e.last_iteration = m.last;
  e.ranks = m.ranks;
  e.plan = make_plan(run_dir, o, m, e.plan_source);
  e.dp_bytes = m.dp_bytes;
  e.findings = find_gaps(e.ranks, e.plan, e.dp_bytes);
  std::ifstream in(run_dir / "metrics.jsonl", std::ios::binary);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"gpu_profile\"") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("gpu_profile") || !j["gpu_profile"].is_object()) continue;
    e.op_families.clear();
    for (const auto& [family, seconds] : j["gpu_profile"].items())
      if (seconds.is_number()) e.op_families.emplace_back(family, seconds.get<double>());
  }
  std::stable_sort(e.op_families.begin(), e.op_families.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return e;
}

// ---- output --------------------------------------------------------------------------

namespace {

// Parts worth a column: non-zero somewhere (measured or planned).
std::vector<size_t> shown_parts(const Explanation& e) {
  std::vector<size_t> parts;
  for (size_t i = 0; i < kStepParts; ++i) {
    bool any = false;
    for (const auto& r : e.ranks) any = any || r.s[i] >= 0.5e-3;
    for (const auto& p : e.plan) any = any || p.s[i] >= 0.5e-3;
    if (any) parts.push_back(i);
  }
  return parts;
}

void write_table(std::ostringstream& o, const Explanation& e, const std::vector<size_t>& parts) {
  o << "ms per iteration and share of the step (parts under 0.5 ms everywhere left out):\n";
  o << fmt::format("{:<22} {:>9}", "", "total");
  for (size_t i : parts) o << fmt::format(" {:>10}", name(i));
  o << "\n";
  auto row = [&](const std::string& who, const PartSeconds& s) {
    const double total = std::accumulate(s.begin(), s.end(), 0.0);
    o << fmt::format("{:<22} {:>9.1f}", who, 1e3 * total);
    for (size_t i : parts) o << fmt::format(" {:>5.1f} {:>3.0f}%", 1e3 * s[i], total > 0 ? 100 * s[i] / total : 0.0);
    o << "\n";
  };
  for (const auto& r : e.ranks) row(fmt::format("rank {} tp{} pp{} dp{}", r.rank, r.tp, r.pp, r.dp), r.s);
  for (const auto& p : e.plan) row(fmt::format("plan, stage {}", p.stage), p.s);
}

constexpr const char* kColours[kStepParts] = {"#1f77b4", "#aec7e8", "#9edae5", "#ff7f0e", "#ffbb78", "#d62728",
                                              "#2ca02c", "#98df8a", "#bcbd22", "#dbdb8d", "#9467bd", "#8c564b",
                                              "#e377c2", "#7f7f7f", "#17becf", "#c7c7c7"};

}  // namespace

std::string explain_text(const Explanation& e) {
  std::ostringstream o;
  double period = 0;
  for (const auto& r : e.ranks) period += r.total() / double(e.ranks.size());
  o << fmt::format(
      "where the time went: {} ({} ranks, {} logged record(s), iterations {}-{}): {:.1f} ms per iteration{}\n",
      e.run_dir, e.ranks.size(), e.records, e.first_iteration, e.last_iteration, 1e3 * period,
      e.clock == "GPU" ? ", by the GPU's clock (CUDA events)" : "");
  o << e.plan_source << "\n";
  o << "largest gaps:\n";
  if (e.findings.empty()) o << "  none: every part within 2 points of the plan, no slow rank or stage\n";
  for (size_t k = 0; k < e.findings.size(); ++k) o << fmt::format("  {}. {}\n", k + 1, e.findings[k].text);
  write_table(o, e, shown_parts(e));
  if (!e.op_families.empty()) {
    double total = 0;
    for (const auto& f : e.op_families) total += f.second;
    o << "GPU time by op family (logging.gpu_profile, ms per iteration, last record):";
    for (const auto& [family, s] : e.op_families)
      o << fmt::format(" {} {:.1f} ({:.0f}%)", family, 1e3 * s, total > 0 ? 100 * s / total : 0.0);
    o << "\n";
  }
  return o.str();
}

std::string explain_svg(const Explanation& e) {
  const auto parts = shown_parts(e);
  const int left = 150, width = 860, row_h = 22, top = 34;
  const int rows = static_cast<int>(e.ranks.size() + e.plan.size());
  const int legend_rows = (static_cast<int>(parts.size()) + 4) / 5;
  const int height = top + rows * row_h + 24 + legend_rows * 18 + 10;
  double scale_max = 1e-9;
  for (const auto& r : e.ranks) scale_max = std::max(scale_max, r.total());
  for (const auto& p : e.plan) scale_max = std::max(scale_max, p.total());
  const double px = (width - left - 80) / scale_max;
  std::ostringstream o;
  o << fmt::format(
      "<svg class=\"plot explain\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\">\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n",
      width, height, width, height);
  o << "<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">Time per iteration by part: each rank, then the "
       "plan per pipeline stage</text>\n";
  auto bar = [&](int y, const std::string& who, const PartSeconds& s) {
    o << fmt::format("<text x=\"10\" y=\"{}\" font-size=\"12\">{}</text>\n", y + 14, html_escape(who));
    double x = left;
    for (size_t i : parts) {
      const double w = s[i] * px;
      if (w <= 0) continue;
      o << fmt::format(
          "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}: {:.1f} "
          "ms</title></rect>\n",
          x, y + 2, w, row_h - 6, kColours[i], label(i), 1e3 * s[i]);
      x += w;
    }
    o << fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\">{:.1f} ms</text>\n", x + 4, y + 14,
                     1e3 * std::accumulate(s.begin(), s.end(), 0.0));
  };
  int y = top;
  for (const auto& r : e.ranks)
    bar(y, fmt::format("rank {} (tp{} pp{} dp{})", r.rank, r.tp, r.pp, r.dp), r.s), y += row_h;
  for (const auto& p : e.plan) bar(y, fmt::format("plan, stage {}", p.stage), p.s), y += row_h;
  y += 10;
  for (size_t k = 0; k < parts.size(); ++k) {
    const int lx = 10 + static_cast<int>(k % 5) * 170, ly = y + static_cast<int>(k / 5) * 18;
    o << fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" "
        "font-size=\"11\">{}</text>\n",
        lx, ly, kColours[parts[k]], lx + 16, ly + 10, name(parts[k]));
  }
  o << "</svg>\n";
  return o.str();
}

std::string explain_html_section(const fs::path& run_dir, const ExplainOptions& o) {
  std::ifstream in(run_dir / "metrics.jsonl", std::ios::binary);
  bool any = false;
  for (std::string line; !any && std::getline(in, line);) any = line.find("\"step_parts\"") != std::string::npos;
  if (!any) return "";  // a run without step parts: no section
  const Explanation e = explain_run(run_dir, o);
  std::ostringstream h;
  h << "<h2>Where the time went</h2>\n<p class=\"note\">" << html_escape(e.plan_source)
    << "</p>\n<ol class=\"gaps\">\n";
  for (const auto& f : e.findings) h << "<li>" << html_escape(f.text) << "</li>\n";
  if (e.findings.empty()) h << "<li>none: every part within 2 points of the plan, no slow rank or stage</li>\n";
  h << "</ol>\n<div class=\"plots\">\n" << explain_svg(e) << "</div>\n";
  return h.str();
}

std::string explain_command_text(const fs::path& run_dir, const ExplainOptions& o) {
  std::error_code ec;
  bool dumps = false;
  if (fs::is_directory(run_dir / "flight_recorder", ec))
    for (const auto& e : fs::directory_iterator(run_dir / "flight_recorder"))
      dumps = dumps || (e.path().filename().string().rfind("rank", 0) == 0 && e.path().extension() == ".json");
  // An MoE run's routing verdict comes first: it stands without step parts.
  const std::string moe = moe_explain_text(run_dir);
  if (!dumps && moe.empty()) return explain_text(explain_run(run_dir, o));
  std::string out = moe.empty() ? "" : moe + "\n";
  if (dumps)
    out += "What ended the run (flight recorder, " + (run_dir / "flight_recorder").string() + "):\n  " +
           parallel::explain_hang(run_dir.string()).text + "\n\n";
  try {
    out += explain_text(explain_run(run_dir, o));
  } catch (const InputError& e) {
    out += std::string("Where the time went: not available: ") + e.what() + "\n";
  }
  return out;
}

}  // namespace mtnlg::app::report
