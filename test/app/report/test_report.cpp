// Tests for `mtnlg report` (app/report/report.cpp, app/report/cmd_report.cpp): metrics.jsonl parsing and
// its errors, tick placement, number formatting, SVG plots (gaps, single points, thinning),
// the whole page (self-contained, eval table, recipe), the CLI, and an [e2e] render in
// headless Chromium checked for a non-blank screenshot by scripts/render-check.py.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <regex>

#include "app/report/report.hpp"
#include "app/commands.hpp"
#include "core/error.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::test;
namespace rep = mtnlg::app::report;

namespace {

int64_t count(const std::string& hay, const std::string& needle) {
  int64_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// A plausible small run: warmup + cosine lr, a batch ramp, a falling loss with one
// non-finite iteration, fp16 loss scale, and a restart (iterations 7..8 logged twice).
void write_fixture_run(const std::filesystem::path& dir, int64_t iters = 40) {
  std::string lines;
  int64_t tokens = 0, samples = 0;
  auto row = [&](int64_t it) {
    const int64_t gbs = std::min<int64_t>(32 + 32 * (it / 5), 256);
    samples += gbs;
    tokens += gbs * 2048;
    const double lr = it < 5 ? 3e-4 * it / 5 : 3e-5 + 0.5 * (3e-4 - 3e-5) * (1 + std::cos(M_PI * it / iters));
    const std::string loss = it == 20 ? "null" : fmt::format("{}", 2.5 + 8.3 * std::exp(-it / 9.0));
    lines += fmt::format(
        "{{\"iteration\": {}, \"consumed_samples\": {}, \"consumed_tokens\": {}, \"loss\": {}, \"lr\": {}, "
        "\"global_batch_size\": {}, \"grad_norm\": {}, \"step_time_s\": {}, \"tokens_per_s\": {}, "
        "\"tflops_per_gpu\": {}, \"mfu\": {}, \"skipped\": {}, \"nan_iterations\": {}, \"peak_memory_bytes\": {}, "
        "\"bytes_sent_tp\": 1000, \"bytes_sent_pp\": 2000, \"bytes_sent_dp\": 3000, \"loss_scale\": {}}}\n",
        it, samples, tokens, loss, lr, gbs, 1.0 + 0.3 * std::sin(it), 0.5 + 0.01 * it, gbs * 2048 / 0.5, 120 + it,
        0.38 + 0.001 * it, it >= 20 ? 1 : 0, it >= 20 ? 1 : 0, 40e9 + it * 1e8, 65536.0 / (it >= 20 ? 2 : 1));
  };
  for (int64_t it = 1; it <= 8; ++it) row(it);
  tokens -= 2 * 256 * 2048;  // roughly rewind: the restart re-does 7 and 8
  for (int64_t it = 7; it <= iters; ++it) row(it);
  write_file(dir / "metrics.jsonl", lines);
  write_file(dir / "recipe.resolved.yaml",
             "model:\n  num_layers: 2  # <b>not html</b>\ntraining:\n  precision: fp16\n");
  write_file(dir / "eval" / "piqa.json",
             R"({"results": {"piqa": {"acc": 0.7421, "acc_stderr": 0.0102, "acc_norm": 0.75}},)"
             R"( "versions": {"piqa": 0}, "config": {"num_fewshot": 0}})");
  write_file(dir / "notes.json", R"({"something": "else"})");  // not eval results: ignored
  write_file(dir / "broken.json", "{ not json");               // not eval results: ignored
}

}  // namespace

TEST_CASE("nice_ticks picks round steps inside the range", "[report]") {
  CHECK(rep::nice_ticks(0, 10, 5) == std::vector<double>{0, 2, 4, 6, 8, 10});
  CHECK(rep::nice_ticks(5, 5) == std::vector<double>{5});
  CHECK(rep::nice_ticks(10, 0, 5) == std::vector<double>{0, 2, 4, 6, 8, 10});
  CHECK(rep::nice_ticks(std::nan(""), 1).empty());
  for (auto [lo, hi] : std::vector<std::pair<double, double>>{
           {0.00013, 0.00031}, {-1, 1}, {2.5, 10.8}, {0, 2.7e11}, {-3e-7, 1e-6}, {65536, 131072}}) {
    auto t = rep::nice_ticks(lo, hi, 5);
    INFO(lo << " .. " << hi);
    REQUIRE(t.size() >= 2);
    CHECK(t.size() <= 11);
    CHECK(std::is_sorted(t.begin(), t.end()));
    CHECK(t.front() >= lo);
    CHECK(t.back() <= hi);
    // The step is 1, 2 or 5 times a power of ten.
    const double step = t[1] - t[0];
    const double mant = step / std::pow(10.0, std::floor(std::log10(step)));
    CHECK((std::fabs(mant - 1) < 1e-6 || std::fabs(mant - 2) < 1e-6 || std::fabs(mant - 5) < 1e-6));
  }
  auto sym = rep::nice_ticks(-1, 1, 4);
  CHECK(std::find(sym.begin(), sym.end(), 0.0) != sym.end());
}

TEST_CASE("format_number gives short labels", "[report]") {
  CHECK(rep::format_number(0) == "0");
  CHECK(rep::format_number(0.125) == "0.125");
  CHECK(rep::format_number(10.8125) == "10.81");
  CHECK(rep::format_number(1500) == "1.5K");
  CHECK(rep::format_number(-2500) == "-2.5K");
  CHECK(rep::format_number(999999) == "1M");
  CHECK(rep::format_number(270e9) == "270B");
  CHECK(rep::format_number(1.2e12) == "1.2T");
  CHECK(rep::format_number(3.5e-5) == "3.5e-5");
  CHECK(rep::format_number(std::numeric_limits<double>::infinity()) == "n/a");
  CHECK(rep::format_bytes(512) == "512 B");
  CHECK(rep::format_bytes(40.0 * (1 << 30)) == "40 GiB");
  CHECK(rep::html_escape("<a href=\"x\">&'") == "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
}

TEST_CASE("read_metrics reads columns, nulls and resumed runs", "[report]") {
  TempDir tmp("report-read");
  write_file(tmp / "metrics.jsonl",
             "{\"iteration\": 1, \"consumed_tokens\": 100, \"loss\": 10.5, \"skipped\": false}\n"
             "\n"
             "{\"iteration\": 2, \"consumed_tokens\": 200, \"loss\": null, \"skipped\": true, \"extra\": \"text\"}\n"
             "{\"iteration\": 3, \"consumed_tokens\": 300, \"loss\": 9.5}\n"
             // resumed from the iteration-1 checkpoint: 2 and 3 again, then on
             "{\"iteration\": 2, \"consumed_tokens\": 200, \"loss\": 9.9}\r\n"
             "{\"iteration\": 3, \"consumed_tokens\": 300, \"loss\": 9.4}\n"
             "{\"iteration\": 4, \"consumed_tokens\": 400, \"loss\": 9.0}\n");
  auto m = rep::read_metrics(tmp / "metrics.jsonl");
  REQUIRE(m.rows == 4);
  CHECK(m.restarts == 1);
  CHECK(m.column("iteration") == std::vector<double>{1, 2, 3, 4});
  CHECK(m.column("loss") == std::vector<double>{10.5, 9.9, 9.4, 9.0});
  CHECK(m.column("skipped")[0] == 0.0);
  CHECK(std::isnan(m.column("skipped")[1]));  // the resumed row 2 has no "skipped"
  CHECK(std::isnan(m.column("absent")[3]));
  CHECK(m.has("loss"));
  CHECK_FALSE(m.has("extra"));  // only non-numeric values
  CHECK_FALSE(m.has("absent"));
}

TEST_CASE("read_metrics keeps a null loss as a gap", "[report]") {
  TempDir tmp("report-null");
  write_file(tmp / "metrics.jsonl", "{\"iteration\": 1, \"loss\": 1.5}\n{\"iteration\": 2, \"loss\": null}\n");
  auto m = rep::read_metrics(tmp / "metrics.jsonl");
  REQUIRE(m.rows == 2);
  CHECK(std::isnan(m.column("loss")[1]));
}

TEST_CASE("read_metrics errors name the file and line", "[report]") {
  TempDir tmp("report-bad");
  auto expect_input_error = [&](const std::string& content, const std::string& want) {
    if (!content.empty() || std::filesystem::exists(tmp / "metrics.jsonl")) write_file(tmp / "metrics.jsonl", content);
    try {
      rep::read_metrics(tmp / "metrics.jsonl");
      FAIL("expected an InputError containing " << want);
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains(want));
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  };
  expect_input_error("", "metrics.jsonl: not found");
  expect_input_error("{\"iteration\": 1}\n{\"iteration\": 2}\n{\"iteration\": 3, oops}\n",
                     "metrics.jsonl:3: not valid JSON");
  expect_input_error("{\"iteration\": 1}\n[1, 2]\n", "metrics.jsonl:2: expected one JSON object per line");
  expect_input_error("{\"loss\": 1}\n", "metrics.jsonl:1: no numeric \"iteration\"");
  expect_input_error("\n\n", "no logged iterations");
}

TEST_CASE("read_metrics ignores an unfinished last line of a live run", "[report]") {
  TempDir tmp("report-live");
  write_file(tmp / "metrics.jsonl", "{\"iteration\": 1, \"loss\": 2}\n{\"iteration\": 2, \"lo");
  auto m = rep::read_metrics(tmp / "metrics.jsonl");
  CHECK(m.rows == 1);
}

TEST_CASE("an SVG plot has axes, ticks, labels and one polyline per finite run", "[report]") {
  const double nan = std::nan("");
  rep::PlotSpec p;
  p.title = "Loss <train>";
  p.x_label = "consumed tokens";
  p.y_label = "loss";
  p.x = {0, 1e6, 2e6, 3e6, 4e6, 5e6, 6e6};
  p.series.push_back({"loss", {10, 8, nan, 6, 5.5, nan, 4}});
  p.marks_x = {2e6, 5e6};
  p.marks_label = "non-finite loss";
  const std::string svg = rep::render_svg_plot(p);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(count(svg, "<polyline") == 2);  // [10, 8] and [6, 5.5]
  CHECK(count(svg, "<circle") == 1);    // the lone 4 after the second gap
  CHECK(count(svg, "class=\"mark\"") == 2);
  CHECK(count(svg, "class=\"xtick\"") >= 3);
  CHECK(count(svg, "class=\"ytick\"") >= 3);
  CHECK_THAT(svg, Catch::Matchers::Contains("Loss &lt;train&gt;"));
  CHECK_THAT(svg, Catch::Matchers::Contains(">consumed tokens<"));
  CHECK_THAT(svg, Catch::Matchers::Contains(">2M<"));
  CHECK_THAT(svg, Catch::Matchers::Contains("non-finite loss"));
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
}

TEST_CASE("an SVG plot of one point or no finite values still renders", "[report]") {
  rep::PlotSpec one;
  one.title = "one";
  one.x = {4096};
  one.series.push_back({"loss", {10.8}});
  const std::string a = rep::render_svg_plot(one);
  CHECK(count(a, "<circle") == 1);
  CHECK(count(a, "<polyline") == 0);
  CHECK(count(a, "class=\"ytick\"") >= 2);
  CHECK(a.find("nan") == std::string::npos);

  rep::PlotSpec none;
  none.title = "none";
  none.x = {1, 2};
  none.series.push_back({"loss", {std::nan(""), std::numeric_limits<double>::infinity()}});
  const std::string b = rep::render_svg_plot(none);
  CHECK_THAT(b, Catch::Matchers::Contains("no finite values"));
  CHECK(count(b, "<polyline") == 0);
  CHECK(b.rfind("</svg>") != std::string::npos);
}

TEST_CASE("long series are thinned per pixel column but keep spikes", "[report]") {
  rep::PlotSpec p;
  p.title = "long";
  const int64_t n = 100000;
  p.series.push_back({"y", {}});
  for (int64_t i = 0; i < n; ++i) {
    p.x.push_back(static_cast<double>(i));
    p.series[0].y.push_back(i == 54321 ? 100.0 : 1.0 + 1e-3 * (i % 7));
  }
  const std::string svg = rep::render_svg_plot(p);
  CHECK(svg.size() < 40000);
  // The spike sets the top of the range: some point is drawn at the top of the plot area.
  std::smatch mt;
  REQUIRE(std::regex_search(svg, mt, std::regex(R"(points="([^"]*)\")")));
  double min_y = 1e9;
  std::string pts = mt[1];
  std::regex pair(R"(([\d.]+),([\d.]+))");
  for (auto it = std::sregex_iterator(pts.begin(), pts.end(), pair); it != std::sregex_iterator(); ++it)
    min_y = std::min(min_y, std::stod((*it)[2]));
  CHECK(min_y < 50);  // plot area top is y=34 plus padding
}

TEST_CASE("the report page is self-contained and has every part", "[report]") {
  TempDir tmp("report-page");
  write_fixture_run(tmp.path());
  rep::ReportSummary s;
  const std::string html = rep::render_report_html(tmp.path(), &s);
  CHECK(s.iterations == 40);
  CHECK(s.plots == 10);  // loss lr gbs tokens/s tflops mfu grad-norm loss-scale step-time memory
  CHECK(s.eval_rows == 2);
  CHECK(count(html, "<svg") == 10);
  CHECK(count(html, "<polyline") >= 10);
  for (const char* title : {"Training loss", "Learning rate", "Global batch size", "Throughput", "TFLOP/s per GPU",
                            "Model FLOPs utilisation", "Gradient norm", "Loss scale (fp16)"})
    CHECK_THAT(html, Catch::Matchers::Contains(std::string(">") + title + "<"));
  CHECK_THAT(html, Catch::Matchers::Contains("non-finite loss"));
  CHECK_THAT(html, Catch::Matchers::Contains("Restarts"));
  // eval table
  CHECK_THAT(html, Catch::Matchers::Contains("<td>piqa</td><td>acc</td><td class=\"num\">0.7421</td>"));
  CHECK_THAT(html, Catch::Matchers::Contains("&plusmn; 0.0102"));
  // recipe shown as escaped text
  CHECK_THAT(html, Catch::Matchers::Contains("num_layers: 2  # &lt;b&gt;not html&lt;/b&gt;"));
  // nothing fetched or run
  for (const char* bad : {"<script", "src=", "href=", "http:", "https:", "url(", "<link", "@import"}) {
    INFO(bad);
    CHECK(html.find(bad) == std::string::npos);
  }
  CHECK(html.find("nan") == std::string::npos);
}

TEST_CASE("the report falls back to iterations and notes what was not logged", "[report]") {
  TempDir tmp("report-minimal");
  write_file(tmp / "metrics.jsonl", "{\"iteration\": 1, \"loss\": 10.9}\n");
  rep::ReportSummary s;
  const std::string html = rep::render_report_html(tmp.path(), &s);
  CHECK(s.plots == 1);
  CHECK_THAT(html, Catch::Matchers::Contains(">iteration<"));
  CHECK_THAT(html, Catch::Matchers::Contains("Not logged in this run: lr"));
  CHECK_THAT(html, Catch::Matchers::Contains("recipe.resolved.yaml not found"));
  CHECK_THAT(html, Catch::Matchers::Contains("No eval results"));
}

TEST_CASE("the report command writes RUN_DIR/report.html or --output and maps errors", "[report]") {
  TempDir tmp("report-cli");
  write_fixture_run(tmp / "run");
  {
    CLI::App app;
    app::register_report(app);
    std::vector<std::string> args = {(tmp / "run").string(), "report"};  // CLI11 wants them reversed
    app.parse(args);
    CHECK(std::filesystem::exists(tmp / "run" / "report.html"));
  }
  {
    CLI::App app;
    app::register_report(app);
    std::vector<std::string> args = {(tmp / "out" / "r.html").string(), "--output", (tmp / "run").string(), "report"};
    app.parse(args);
    CHECK(std::filesystem::exists(tmp / "out" / "r.html"));
    // no temporary left behind
    int64_t files = 0;
    for (auto& e : std::filesystem::directory_iterator(tmp / "out")) files += e.is_regular_file();
    CHECK(files == 1);
  }
  {
    CLI::App app;
    app::register_report(app);
    std::vector<std::string> args = {(tmp / "nowhere").string(), "report"};
    CHECK_THROWS_AS(app.parse(args), InputError);
  }
}

TEST_CASE("mtnlg report runs from the binary with the documented exit codes", "[e2e][report]") {
  auto help = run_mtnlg("--help");
  if (help.out.find("report") == std::string::npos)
    FAIL(
        "`mtnlg report` is not registered: app/main.cpp must call mtnlg::app::register_report(app) "
        "(app/commands.hpp)");
  TempDir tmp("report-e2e");
  std::filesystem::create_directories(tmp / "empty");
  auto r = run_mtnlg("report " + (tmp / "empty").string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("metrics.jsonl: not found"));

  write_file(tmp / "bad" / "metrics.jsonl", "{\"iteration\": 1}\nnot json\n");
  r = run_mtnlg("report " + (tmp / "bad").string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("metrics.jsonl:2:"));

  write_fixture_run(tmp / "run");
  r = run_mtnlg("report " + (tmp / "run").string() + " --output " + (tmp / "run" / "x.html").string());
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(std::filesystem::exists(tmp / "run" / "x.html"));
}

TEST_CASE("the report renders in headless Chromium as a non-blank page", "[e2e][report]") {
  TempDir tmp("report-render");
  write_fixture_run(tmp.path());
  const auto s = rep::write_report(tmp.path(), {});
  const std::string html = read_file(s.output);
  CHECK(count(html, "<polyline") >= 10);
  const auto png = tmp / "report.png";
  auto r = run_command(python() + " " + source_dir() + "/scripts/render-check.py " + s.output.string() + " --png " +
                       png.string() + " --window-size 1200,2000 --min-colours 16 --min-ink 0.01");
  INFO(r.out);
  if (r.exit_code == 77) {
    WARN("chromium not installed (Debian package `chromium`): render check skipped");
    return;
  }
  CHECK(r.exit_code == 0);
  CHECK(std::filesystem::exists(png));
}

TEST_CASE("the report names the ranks flagged as stragglers and their iterations", "[report]") {
  TempDir tmp("report-straggler");
  std::string lines;
  for (int it = 1; it <= 12; ++it) {
    // rank 2 named at 4..6 and again at 9..10, rank 3 at 12; detection ran on every row.
    const int flagged = (it >= 4 && it <= 6) || it == 9 || it == 10 ? 2 : it == 12 ? 3 : -1;
    lines +=
        fmt::format("{{\"iteration\": {}, \"loss\": 3.0, \"slowest_rank\": {}, \"slowest_ratio\": 1.5{}}}\n", it,
                    flagged >= 0 ? flagged : 1, flagged >= 0 ? fmt::format(", \"straggler_rank\": {}", flagged) : "");
  }
  write_file(tmp / "metrics.jsonl", lines);
  const std::string html = rep::render_report_html(tmp.path(), nullptr);
  CHECK_THAT(html, Catch::Matchers::Contains("Stragglers flagged"));
  CHECK_THAT(html, Catch::Matchers::Contains("rank 2 at iterations 4-6, 9-10; rank 3 at iteration 12"));

  TempDir clean("report-straggler-none");
  write_file(clean / "metrics.jsonl",
             "{\"iteration\": 1, \"loss\": 3.0, \"slowest_rank\": 0, \"slowest_ratio\": 1.01}\n");
  const std::string none = rep::render_report_html(clean.path(), nullptr);
  CHECK_THAT(none, Catch::Matchers::Contains("Stragglers flagged"));
  CHECK(none.find("rank 0 at") == std::string::npos);

  TempDir off("report-straggler-off");  // a run without detection: no row
  write_file(off / "metrics.jsonl", "{\"iteration\": 1, \"loss\": 3.0}\n");
  CHECK(rep::render_report_html(off.path(), nullptr).find("Stragglers") == std::string::npos);
}
