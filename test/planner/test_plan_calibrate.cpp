// `mtnlg plan --calibrate RUN_DIR ... [--profile-out FILE]` and `--gpu-profile FILE`:
// the fit recovers known constants from step times the planner itself generated (no
// timing involved), the written profile predicts another layout, bad input is one line
// and exit 2. The hidden "[.timing]" case trains tiny CPU layouts for real and checks that
// a profile fitted to three of them predicts a fourth within 15% (run it on an idle
// machine: `build/test/test_planner "[.timing]"`).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "planner/cost_model.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg::test;
namespace cost = mtnlg::cost;

namespace {

// tiny-mock's model at a given width / micro batch / recompute (CPU, fp32).
std::string tiny(int64_t layers, int64_t hidden, int64_t micro, int64_t batch, const char* recompute) {
  return fmt::format(
      "model: {{num_layers: {}, hidden_size: {}, num_attention_heads: 4, seq_length: 64, vocab_size: 512, "
      "make_vocab_size_divisible_by: 8, hidden_dropout: 0.0, attention_dropout: 0.0}}\n"
      "parallel: {{recompute_granularity: {}}}\n"
      "training: {{precision: fp32, micro_batch_size: {}, global_batch_size: {}, train_iters: 8, num_threads: 1}}\n"
      "data: {{mock: true}}\n"
      "optimizer: {{lr: 1.0e-3, min_lr: 1.0e-4, lr_warmup_tokens: 1024}}\n"
      "logging: {{tensorboard: false, log_interval: 1}}\n",
      layers, hidden, recompute, micro, batch);
}

double plan_time(const std::string& recipe, const std::string& profile) {
  auto r = run_mtnlg("plan " + recipe + " --gpu-profile " + profile + " --json 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out)["iteration_time_s"].get<double>();
}

// A profile file with the cpu entry's constants scaled (the "truth" for the synthetic runs).
void write_truth(const std::string& path) {
  write_file(path, R"({"format": "mtnlg-gpu-profile/1", "name": "truth", "peak_flops": 2e11, "gemm_eff_max": 0.35,
    "sm_count": 1, "memory_bytes": 1.7e10, "hbm_bw": 4e9, "nvlink_bus_bw": 5e9, "ib_bw": 1e9,
    "nvlink_alpha": 5e-6, "ib_alpha": 2e-5, "kernel_overhead": 9e-6})");
}

}  // namespace

TEST_CASE("plan --calibrate recovers constants from generated step times and writes a usable profile", "[e2e]") {
  TempDir tmp("calibrate");
  const std::string truth = (tmp / "truth.json").string();
  write_truth(truth);
  struct Run {
    int64_t layers, hidden, micro, batch;
    const char* rc;
  } runs[] = {{2, 64, 2, 8, "none"}, {4, 128, 4, 8, "none"}, {2, 256, 1, 4, "full"}};
  std::string args;
  for (int i = 0; i < 3; ++i) {
    const auto dir = tmp / fmt::format("run{}", i);
    std::filesystem::create_directories(dir);
    write_file(dir / "recipe.resolved.yaml",
               tiny(runs[i].layers, runs[i].hidden, runs[i].micro, runs[i].batch, runs[i].rc));
    const double t = plan_time((dir / "recipe.resolved.yaml").string(), truth);
    std::string lines;
    for (int it = 1; it <= 5; ++it)  // the first record (start-up) is slow and must be left out
      lines += fmt::format("{{\"iteration\": {}, \"global_batch_size\": {}, \"step_time_s\": {}}}\n", it, runs[i].batch,
                           it == 1 ? 10 * t : t * (1.0 + 0.001 * (it % 2)));
    write_file(dir / "metrics.jsonl", lines);
    args += " --calibrate " + dir.string();
  }
  const std::string profile = (tmp / "fitted.json").string();
  auto r = run_mtnlg("plan" + args + " --gpu cpu --profile-out " + profile);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("3 constant(s) fitted"));
  CHECK_THAT(r.out, Catch::Matchers::Contains("residual:"));
  auto j = nlohmann::json::parse(read_file(profile));
  CHECK(j["calibration"]["rms_relative_error"].get<double>() < 0.01);
  CHECK(j["calibration"]["runs"].size() == 3);
  // The fitted profile predicts a layout it was not fitted to like the truth does.
  const std::string other = (tmp / "other.yaml").string();
  write_file(other, tiny(3, 192, 2, 8, "selective"));
  CHECK(plan_time(other, profile) == Approx(plan_time(other, truth)).epsilon(0.03));

  // One run fits one constant (the compute rate) and reproduces that run.
  auto one = run_mtnlg("plan --calibrate " + (tmp / "run1").string() + " --gpu cpu --json");
  INFO(one.out);
  REQUIRE(one.exit_code == 0);
  auto oj = nlohmann::json::parse(one.out);
  CHECK(oj["calibration"]["free_parameters"] == 1);
  CHECK(oj["calibration"]["rms_relative_error"].get<double>() < 0.01);
  CHECK(std::filesystem::exists(tmp / "run1" / "gpu-profile.json"));
}

TEST_CASE("plan --calibrate with multi-process runs also recovers the latency and the compute slots", "[e2e]") {
  // The truth's latency is 1000x the cpu entry's (what a loaded machine's scheduling adds)
  // and one process of a node computes at full speed at a time (compute_slots 1: two
  // processes compute 2x slower side by side). Three single-process runs, one tensor-
  // and one data-parallel 2-process run (its world size recorded in metrics.jsonl, as the
  // trainer does) are generated with the mtnlg profile; a pp2 layout is held out.
  TempDir tmp("calibrate-latency");
  const std::string truth = (tmp / "truth.json").string();
  write_file(truth, R"({"format": "mtnlg-gpu-profile/1", "name": "truth", "peak_flops": 2e11, "gemm_eff_max": 0.35,
    "sm_count": 1, "memory_bytes": 1.7e10, "hbm_bw": 4e9, "nvlink_bus_bw": 5e9, "ib_bw": 1e9,
    "nvlink_alpha": 5e-3, "ib_alpha": 2e-2, "kernel_overhead": 9e-6, "compute_slots": 1})");
  auto timed = [&](const std::string& recipe, int gpus) {
    auto r =
        run_mtnlg(fmt::format("plan {} --gpus {} --gpu-profile {} --software mtnlg --json 2>&1", recipe, gpus, truth));
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out)["iteration_time_s"].get<double>();
  };
  auto with_layout = [](std::string y, const std::string& parallel) {
    const auto at = y.find("parallel: {");
    y.replace(at, std::string("parallel: {").size(), "parallel: {" + parallel + ", ");
    return y;
  };
  struct Run {
    int64_t layers, hidden, micro, batch;
    const char* rc;
    const char* parallel;
    int world;
  } runs[] = {{2, 64, 2, 8, "none", "", 1},
              {4, 128, 4, 8, "none", "", 1},
              {2, 256, 1, 4, "full", "", 1},
              {2, 128, 2, 8, "none", "tensor_model_parallel_size: 2", 2},
              {2, 256, 2, 8, "none", "", 2}};
  std::string args;
  for (int i = 0; i < 5; ++i) {
    const auto dir = tmp / fmt::format("run{}", i);
    std::filesystem::create_directories(dir);
    std::string y = tiny(runs[i].layers, runs[i].hidden, runs[i].micro, runs[i].batch, runs[i].rc);
    if (*runs[i].parallel) y = with_layout(y, runs[i].parallel);
    write_file(dir / "recipe.resolved.yaml", y);
    const double t = timed((dir / "recipe.resolved.yaml").string(), runs[i].world);
    write_file(dir / "metrics.jsonl",
               fmt::format("{{\"iteration\": 1, \"global_batch_size\": {}, \"step_time_s\": {}, \"world_size\": {}}}\n",
                           runs[i].batch, t, runs[i].world));
    args += " --calibrate " + dir.string();
  }
  auto r = run_mtnlg("plan" + args + " --gpu cpu --software mtnlg --json --profile-out " + (tmp / "fit.json").string());
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["calibration"]["free_parameters"] == 5);
  CHECK(j["calibration"]["latency_scale"].get<double>() == Approx(1000).epsilon(0.05));
  CHECK(j["calibration"]["compute_slots"].get<double>() == Approx(1).epsilon(0.05));
  CHECK(j["calibration"]["rms_relative_error"].get<double>() < 0.01);
  // A pipeline layout, not fitted, is predicted as the truth times it.
  const std::string pp2 = (tmp / "pp2.yaml").string();
  write_file(pp2, with_layout(tiny(4, 128, 1, 8, "none"), "pipeline_model_parallel_size: 2"));
  auto pr =
      run_mtnlg("plan " + pp2 + " --gpu-profile " + (tmp / "fit.json").string() + " --software mtnlg --json 2>&1");
  INFO(pr.out);
  REQUIRE(pr.exit_code == 0);
  CHECK(nlohmann::json::parse(pr.out)["iteration_time_s"].get<double>() == Approx(timed(pp2, 2)).epsilon(0.03));
}

TEST_CASE("plan --calibrate and --gpu-profile reject bad input with one line and exit 2", "[e2e]") {
  TempDir tmp("calibrate-bad");
  write_file(tmp / "bad.json", "{\"format\": \"something else\"}");
  write_file(tmp / "neg.json", R"({"format": "mtnlg-gpu-profile/1", "peak_flops": -1})");
  std::filesystem::create_directories(tmp / "empty");
  const std::string recipe = source_dir() + "/recipes/tiny-mock.yaml";
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"plan --calibrate " + (tmp / "nope").string(), "no recipe.resolved.yaml"},
      {"plan --calibrate " + (tmp / "empty").string(), "no recipe.resolved.yaml"},
      {"plan " + recipe + " --gpu-profile " + (tmp / "bad.json").string(), "not a GPU profile"},
      {"plan " + recipe + " --gpu-profile " + (tmp / "neg.json").string(), "peak_flops"},
      {"plan " + recipe + " --gpu-profile " + (tmp / "missing.json").string(), "cannot open"},
      {"plan " + recipe + " --software pytorch", "megatron-lm, megatron-lm-2021, megatron-deepspeed"},
      {"plan", "RECIPE file is required"},
      {"plan " + source_dir() +
           "/recipes/mtnlg-530b.yaml --gpus 2240 --software megatron-deepspeed --set "
           "parallel.num_layers_per_virtual_pipeline_stage=1 --set training.rampup_batch_size=null --set "
           "training.global_batch_size=2240",
       "no interleaved schedule"},
  };
  for (auto& c : cases) {
    auto r = run_mtnlg(c.args + " 2>&1");
    INFO(c.args << "\n" << r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Catch::Matchers::Contains(c.expect));
  }
}

TEST_CASE("a profile calibrated on three tiny CPU runs predicts a fourth within 15%", "[.timing]") {
  TempDir tmp("calibrate-cpu");
  struct Run {
    int64_t layers, hidden, micro, batch;
    const char* rc;
  } runs[] = {{2, 256, 2, 8, "none"}, {4, 384, 1, 4, "none"}, {2, 512, 2, 4, "full"}, {3, 320, 2, 8, "selective"}};
  std::vector<std::string> dirs;
  for (int i = 0; i < 4; ++i) {
    const auto dir = tmp / fmt::format("run{}", i);
    const auto recipe = tmp / fmt::format("r{}.yaml", i);
    write_file(recipe, tiny(runs[i].layers, runs[i].hidden, runs[i].micro, runs[i].batch, runs[i].rc));
    auto r = run_mtnlg("train " + recipe.string() + " --quiet --set logging.dir=" + dir.string() + " 2>&1");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    dirs.push_back(dir.string());
  }
  const std::string profile = (tmp / "cpu.json").string();
  auto c = run_mtnlg("plan --calibrate " + dirs[0] + " --calibrate " + dirs[1] + " --calibrate " + dirs[2] +
                     " --gpu cpu --software mtnlg --step-stat min --profile-out " + profile + " 2>&1");
  INFO(c.out);
  REQUIRE(c.exit_code == 0);
  WARN(c.out);
  // The fourth run's measured step time (its fastest iteration, start-up left out: the
  // machine is shared) against the prediction, both under this trainer's profile.
  auto m =
      run_mtnlg("plan --calibrate " + dirs[3] + " --gpu-profile " + profile + " --software mtnlg --step-stat min " +
                "--profile-out " + (tmp / "ignored.json").string() + " --json 2>&1");
  REQUIRE(m.exit_code == 0);
  const double measured = nlohmann::json::parse(m.out)["calibration"]["runs"][0]["measured_s"].get<double>();
  auto p = run_mtnlg("plan " + (tmp / "run3" / "recipe.resolved.yaml").string() + " --gpu-profile " + profile +
                     " --software mtnlg --json 2>&1");
  REQUIRE(p.exit_code == 0);
  const double predicted = nlohmann::json::parse(p.out)["iteration_time_s"].get<double>();
  WARN("fourth layout: measured " << measured << " s, predicted " << predicted << " s");
  CHECK(predicted == Approx(measured).epsilon(0.15));
}

TEST_CASE("plan --calibrate BENCH.json fits the GEMM curve and attention rates and writes a usable profile", "[e2e]") {
  // A kernel benchmark file as scripts/bench/gpu_gemm_attn.py writes it, with times generated
  // from the planner's own curve for known constants (cost::gemm_seconds / attention_seconds).
  cost::GpuSpec truth = cost::gpu_spec("h100-80g");
  truth.gemm_eff_max = 0.78;
  truth.gemm_k_half = 256;
  truth.attn_fwd_flops = 500e12;
  truth.attn_bwd_flops = 420e12;
  nlohmann::json j = {{"format", "mtnlg-gpu-bench/1"}, {"device", "synthetic"}};
  j["gemm"] = nlohmann::json::array();
  for (int64_t n : {512, 1024, 2048, 4096, 8192, 16384})
    j["gemm"].push_back({{"m", n}, {"n", n}, {"k", n}, {"seconds", cost::gemm_seconds(truth, n, n, n)}});
  for (int64_t k : {256, 1024, 4096})
    j["gemm"].push_back({{"m", 4096}, {"n", 1024}, {"k", k}, {"seconds", cost::gemm_seconds(truth, 4096, 1024, k)}});
  j["attention"] = nlohmann::json::array();
  for (int64_t d : {64, 128})
    for (int64_t s : {1024, 4096, 16384}) {
      const int64_t b = 16384 / s, h = 2048 / d;
      j["attention"].push_back({{"batch", b},
                                {"heads", h},
                                {"seq", s},
                                {"head_dim", d},
                                {"causal", true},
                                {"fwd_seconds", cost::attention_seconds(truth, s, d, b * h, false)},
                                {"bwd_seconds", cost::attention_seconds(truth, s, d, b * h, true)}});
    }
  TempDir tmp("calibrate-bench");
  const auto bench = tmp / "bench.json";
  write_file(bench, j.dump());
  const auto prof = tmp / "h100.json";
  auto r = run_mtnlg("plan --calibrate " + bench.string() + " --gpu h100-80g --profile-out " + prof.string() + " 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("GEMM curve") && Catch::Matchers::Contains("attention:"));
  auto p = nlohmann::json::parse(read_file(prof.string()));
  CHECK(p["attn_fwd_flops"].get<double>() == Approx(500e12).epsilon(0.05));
  CHECK(p["attn_bwd_flops"].get<double>() == Approx(420e12).epsilon(0.05));
  CHECK(p["calibration"]["gemm_rms_relative_error"].get<double>() < 0.03);
  // The profile plans (megatron-core uses its attention rates).
  const auto recipe = tmp / "r.yaml";
  write_file(
      recipe,
      "model: {num_layers: 4, hidden_size: 2048, num_attention_heads: 16, seq_length: 4096, vocab_size: 32000}\n"
      "training: {precision: bf16, micro_batch_size: 1, global_batch_size: 8, train_iters: 10}\ndata: {mock: true}\n");
  auto q = run_mtnlg("plan " + recipe.string() + " --gpu-profile " + prof.string() +
                     " --software megatron-core --json 2>&1");
  INFO(q.out);
  REQUIRE(q.exit_code == 0);
  // Not a benchmark file: one line, exit 2.
  const auto bad = tmp / "bad.json";
  write_file(bad, "{\"gemm\": []}");
  auto b = run_mtnlg("plan --calibrate " + bad.string() + " 2>&1");
  CHECK(b.exit_code == 2);
  CHECK_THAT(b.out, Catch::Matchers::Contains("mtnlg-gpu-bench/1"));
}

// Three runs of this trainer on one H200 (bf16, unfused attention, one GPU, 2026-11-26,
// commit 811a019 with its GELU epilogue taken as refused: GEMM + separate GELU kernels),
// their recipes and metrics.jsonl records (step times) kept in test/fixtures/gpu-runs/h200-bf16.
// Before the fit had physical ranges and a prior, the same three runs gave GEMM efficiency
// 0.53 of peak, 9.5 TB/s of HBM (twice the data sheet) and a kernel overhead of 0.007 us:
// three free constants, three runs, an exact but meaningless solution.
TEST_CASE("plan --calibrate on three H200 bf16 runs gives physical constants and each run within 10%", "[e2e]") {
  TempDir tmp("calibrate-h200");
  const std::string fx = source_dir() + "/test/fixtures/gpu-runs/h200-bf16/";
  const std::vector<std::string> names = {"gpt2-124m", "gpt2-1.5b", "gpt-1.3b-s2048"};
  auto fit = [&](const std::vector<std::string>& which, const std::string& out) {
    std::string args;
    for (auto& n : which) args += " --calibrate " + fx + n;
    auto r = run_mtnlg("plan" + args + " --gpu h200-141g --software mtnlg --json --profile-out " + out + " 2>&1");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out);
  };
  const auto j = fit(names, (tmp / "all.json").string());
  const auto& c = j["calibration"];
  INFO(j.dump(1));
  CHECK(c["physical"].get<bool>());
  // Physical: a fraction of peak, at most the data sheet's bandwidth, a kernel overhead in range.
  const double eff = j["gemm_eff_max"], bw = j["hbm_bw"], ov = j["kernel_overhead"];
  CHECK(eff > 0.3);
  CHECK(eff <= 1.0);
  CHECK(bw <= 4.8e12 * (1 + 1e-9));
  CHECK(bw >= 0.3 * 4.8e12);
  CHECK(ov >= cost::kKernelOverheadRange[0] * (1 - 1e-9));
  CHECK(ov <= cost::kKernelOverheadRange[1] * (1 + 1e-9));
  REQUIRE(c["runs"].size() == 3);
  std::map<std::string, double> measured;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& run = c["runs"][i];
    const double m = run["measured_s"], p = run["predicted_s"];
    measured[names[i]] = m;
    INFO(names[i] << ": measured " << m << " s, fitted " << p << " s");
    CHECK(std::abs(p / m - 1) <= 0.10);
  }
  fmt::print("h200 fit on 3 runs: gemm_eff_max {:.3f}, hbm_bw {:.0f} GB/s, kernel overhead {:.2f} us, rms {:.1f}%\n",
             eff, bw / 1e9, ov * 1e6, 100 * c["rms_relative_error"].get<double>());

  // Held out: fit on two runs, predict the third. Reported; bounded loosely (two runs fix two
  // constants, the third keeps the data-sheet value, so a shape the two did not cover, s 2048
  // against 1024, may miss by more than the fit's own residual).
  for (size_t k = 0; k < names.size(); ++k) {
    std::vector<std::string> two;
    for (size_t i = 0; i < names.size(); ++i)
      if (i != k) two.push_back(names[i]);
    const std::string prof = (tmp / fmt::format("without-{}.json", names[k])).string();
    const auto f = fit(two, prof);
    CHECK(f["gemm_eff_max"].get<double>() <= 1.0);
    CHECK(f["hbm_bw"].get<double>() <= 4.8e12 * (1 + 1e-9));
    auto r = run_mtnlg("plan " + fx + names[k] + "/recipe.resolved.yaml --gpu-profile " + prof +
                       " --software mtnlg --json 2>&1");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    const double p = nlohmann::json::parse(r.out)["iteration_time_s"];
    const double err = p / measured[names[k]] - 1;
    fmt::print("h200 held out {}: fitted on the other two, measured {:.4f} s, predicted {:.4f} s ({:+.1f}%)\n",
               names[k], measured[names[k]], p, 100 * err);
    CHECK(std::abs(err) <= 0.20);
  }
}
