// MoE balance in `mtnlg report` and `report --explain` (app/report/moe_view.cpp) from
// hand-written metrics.jsonl files: the nested moe_layers read through a resumed run, the
// heat map's cells, columns and colours, the page's section, and the routing verdict that
// names a collapsed layer and leaves a balanced one alone.
#include <catch2/catch.hpp>

#include <cmath>

#include "app/report/moe_view.hpp"
#include "core/error.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::test;
namespace rep = mtnlg::app::report;
using Catch::Matchers::Contains;

namespace {

int64_t count(const std::string& hay, const std::string& needle) {
  int64_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

std::string layer_json(int64_t layer, const std::vector<int64_t>& tokens, int64_t dropped = 0) {
  double sum = 0, lo = 1e300, hi = 0;
  for (auto t : tokens) sum += double(t), lo = std::min(lo, double(t)), hi = std::max(hi, double(t));
  const double mean = sum / double(tokens.size());
  return fmt::format(
      "{{\"layer\": {}, \"tokens_per_expert\": [{}], \"min_over_mean\": {}, \"max_over_mean\": {}, \"dropped\": {}}}",
      layer, fmt::join(tokens, ", "), lo / mean, hi / mean, dropped);
}

std::string row(int64_t it, double aux, const std::vector<std::string>& layers) {
  return fmt::format(
      "{{\"iteration\": {}, \"consumed_tokens\": {}, \"loss\": {}, \"moe_load_balancing_loss\": {}, "
      "\"moe_z_loss\": 2.5, \"moe_layers\": [{}]}}\n",
      it, 512 * it, 10.0 - 0.1 * double(it), aux, fmt::join(layers, ", "));
}

// 8 experts, top-2, 1024 slots a step: layer 0 balanced (128 each, give or take), layer 2
// collapsed onto experts 3 and 5 from iteration 5 on.
void write_run(const std::filesystem::path& dir, bool collapse, int64_t iters = 12) {
  std::string lines;
  for (int64_t it = 1; it <= iters; ++it) {
    const std::vector<int64_t> balanced{120, 136, 128, 128, 110, 146, 128, 128};
    const std::vector<int64_t> collapsed{0, 4, 0, 500, 0, 504, 8, 8};
    lines += row(it, collapse && it >= 5 ? 3.6 : 1.02,
                 {layer_json(0, balanced), layer_json(2, collapse && it >= 5 ? collapsed : balanced)});
  }
  write_file(dir / "metrics.jsonl", lines);
}

}  // namespace

TEST_CASE("moe report: moe_layers are read per row, a resumed run's rows replacing the abandoned ones", "[report]") {
  TempDir tmp("moe-read");
  write_file(tmp / "metrics.jsonl",
             row(1, 1.0, {layer_json(0, {4, 2, 1, 1})}) + row(2, 1.0, {layer_json(0, {1, 1, 1, 5})}) +
                 row(3, 1.0, {layer_json(0, {1, 1, 1, 5})}) +
                 // resumed from the iteration-1 checkpoint: 2 and 3 again, then 4
                 row(2, 1.1, {layer_json(0, {2, 2, 2, 2})}) + row(3, 1.1, {layer_json(0, {3, 3, 1, 1})}) +
                 row(4, 1.1, {}) + "{\"iteration\": 5, \"loss\": 9}\n");
  const auto m = rep::read_metrics(tmp / "metrics.jsonl");
  REQUIRE(m.rows == 5);
  CHECK(m.restarts == 1);
  REQUIRE(m.moe.size() == 5);
  CHECK(m.moe[1][0].tokens == std::vector<double>{2, 2, 2, 2});
  CHECK(m.moe[2][0].tokens == std::vector<double>{3, 3, 1, 1});
  CHECK(m.moe[2][0].max_over_mean == 1.5);
  CHECK(m.moe[3].empty());                                                       // logged "moe_layers": []
  CHECK(m.moe[4].empty());                                                       // no moe_layers key
  CHECK(std::find(m.keys.begin(), m.keys.end(), "moe_layers") == m.keys.end());  // not a scalar column
  CHECK(m.column("moe_load_balancing_loss")[1] == 1.1);

  // Columns: tokens / the layer's mean; iterations binned and averaged when asked for fewer.
  auto map = rep::moe_heat_map(m);
  REQUIRE(map.layers == std::vector<int64_t>{0});
  REQUIRE(map.experts == 4);
  REQUIRE(map.columns.size() == 3);  // the three rows with layers: iterations 1, 2, 3
  CHECK(map.columns[1] == std::pair<double, double>{2, 2});
  CHECK(map.load[0][0] == std::vector<double>{2.0, 1.0, 1.5});
  CHECK(map.load[0][3] == std::vector<double>{0.5, 1.0, 0.5});
  map = rep::moe_heat_map(m, 2);
  REQUIRE(map.columns.size() == 2);
  CHECK(map.columns[0] == std::pair<double, double>{1, 1});
  CHECK(map.columns[1] == std::pair<double, double>{2, 3});
  CHECK(map.load[0][0][1] == Approx(1.25));  // (1 + 1.5) / 2
  const std::string svg = rep::moe_heat_map_svg(map);
  CHECK(count(svg, "<rect x=") == 4 * 2 + 60);  // the cells and the legend's 60 steps
  CHECK_THAT(svg, Contains(">layer 0<") && Contains("iteration 1") && Contains("iteration 3 (2 columns") &&
                      Contains("tokens / mean"));
}

TEST_CASE("moe report: bad moe_layers are one-line errors naming the file, line and field", "[report]") {
  TempDir tmp("moe-bad");
  for (const std::string bad : {"\"moe_layers\": 3", "\"moe_layers\": [{\"tokens_per_expert\": [1]}]",
                                "\"moe_layers\": [{\"layer\": 0, \"tokens_per_expert\": [1, \"x\"]}]",
                                "\"moe_layers\": [{\"layer\": 0, \"tokens_per_expert\": 7}]"}) {
    write_file(tmp / "metrics.jsonl", "{\"iteration\": 1}\n{\"iteration\": 2, " + bad + "}\n");
    try {
      rep::read_metrics(tmp / "metrics.jsonl");
      FAIL("expected an InputError for " << bad);
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Contains("metrics.jsonl:2: moe_layers:"));
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("moe report: the load colours run blue, white, red and grey for no data", "[report]") {
  CHECK(rep::moe_load_colour(0, 4) == "#313695");
  CHECK(rep::moe_load_colour(1, 4) == "#f7f7f7");
  CHECK(rep::moe_load_colour(4, 4) == "#a50026");
  CHECK(rep::moe_load_colour(9, 4) == "#a50026");
  CHECK(rep::moe_load_colour(NAN, 4) == "#dddddd");
  CHECK(rep::moe_load_colour(2, 4) != rep::moe_load_colour(3, 4));
}

TEST_CASE("moe verdict: a collapsed layer is named with what to do, a balanced run is not flagged", "[report]") {
  TempDir tmp("moe-verdict");
  write_run(tmp / "ok", false);
  write_run(tmp / "bad", true);
  write_file(tmp / "bad" / "recipe.resolved.yaml", read_file(source_dir() + "/recipes/tiny-moe.yaml"));
  const auto ok = rep::moe_verdict(rep::read_metrics(tmp / "ok" / "metrics.jsonl"), {});
  CHECK(ok.findings.empty());
  CHECK(ok.layers == 2);
  CHECK(ok.first_iteration == 10);  // the last quarter of 12 rows
  CHECK(ok.last_iteration == 12);
  CHECK_THAT(rep::moe_verdict_text(ok), Contains("balanced: no layer's 2 busiest experts took 62.5% of the slots"));

  const auto facts = rep::moe_router_facts(tmp / "bad");
  CHECK(facts.from_recipe);
  CHECK(facts.topk == 2);
  CHECK(facts.lr == 1e-3);
  const auto bad = rep::moe_verdict(rep::read_metrics(tmp / "bad" / "metrics.jsonl"), facts);
  REQUIRE(bad.findings.size() == 1);
  CHECK(bad.worst_layer == 2);
  const std::string text = rep::moe_verdict_text(bad);
  INFO(text);
  CHECK_THAT(text, Contains("layer 2's routing collapsed: over iterations 10-12 its 2 busiest experts took 98%"));
  CHECK_THAT(text, Contains("the balancing loss averaged 3.60 over the layers (1 = uniform)"));
  CHECK_THAT(text, Contains("what to do about the collapse: lower optimizer.lr (now 0.001; ") &&
                       Contains("raise model.moe_aux_loss_coeff (now 0.01)") &&
                       Contains("moe_router_enable_expert_bias: true"));
  CHECK(text.find("layer 0") == std::string::npos);

  // Balancing off: the advice turns it on. Drops over 10% of a layer's slots: named too.
  rep::MoeRouterFacts off;
  off.balancing = false;
  CHECK_THAT(rep::moe_verdict_text(rep::moe_verdict(rep::read_metrics(tmp / "bad" / "metrics.jsonl"), off)),
             Contains("turn the balancing loss on"));
  write_file(tmp / "drop" / "metrics.jsonl",
             row(1, 1.0, {layer_json(0, {100, 100, 100, 100, 100, 100, 100, 100}, 200)}));
  const auto drop = rep::moe_verdict(rep::read_metrics(tmp / "drop" / "metrics.jsonl"), {});
  REQUIRE(drop.findings.size() == 1);
  CHECK_THAT(drop.findings[0].text, Contains("layer 0 dropped 20% of its routed slots"));
}

TEST_CASE("moe report: the page's section and report --explain's lines without step parts", "[report]") {
  TempDir tmp("moe-page");
  write_run(tmp / "run", true, 400);  // more rows than columns: binned
  rep::ReportSummary s;
  const std::string html = rep::render_report_html(tmp / "run", &s);
  CHECK_THAT(html, Contains("<h2>Mixture of experts</h2>") && Contains("MoE losses (mean over layers)") &&
                       Contains("Expert load, worst layer") && Contains("class=\"plot moe-heat\"") &&
                       Contains("(160 columns, iterations averaged)") && Contains("layer 2&#39;s routing collapsed") &&
                       Contains("What to do about the collapse: "));
  CHECK(html.find("<script") == std::string::npos);
  CHECK(s.plots >= 3);  // loss, and the two MoE plots
  const std::string text = rep::explain_command_text(tmp / "run");
  INFO(text);
  CHECK_THAT(text, Contains("expert routing: 2 MoE layer(s) of 8 experts, top-2, judged over iterations 301-400"));
  CHECK_THAT(text, Contains("layer 2's routing collapsed"));
  CHECK_THAT(text, Contains("Where the time went: not available: ") && Contains("no step_parts records"));
  // A run without MoE layers: no section.
  write_file(tmp / "dense" / "metrics.jsonl", "{\"iteration\": 1, \"loss\": 3}\n");
  CHECK(rep::render_report_html(tmp / "dense").find("Mixture of experts") == std::string::npos);
}

TEST_CASE("mtnlg report: bad moe_layers exit 2 with one line", "[e2e][report]") {
  TempDir tmp("moe-exit");
  write_file(tmp / "metrics.jsonl", "{\"iteration\": 1, \"moe_layers\": {}}\n");
  for (const std::string cmd : {"report ", "report --explain "}) {
    auto r = run_mtnlg(cmd + tmp.str());
    INFO(r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Contains("metrics.jsonl:1: moe_layers:"));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}
