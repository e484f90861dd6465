// The run's report files (app/train/run_reports.hpp): metrics.jsonl's line per logged
// iteration with the fields readers depend on (the GPU-only ones only on a GPU run), and
// the per-rank memory and communication reports.
#include <catch2/catch.hpp>

#include <memory>
#include <nlohmann/json.hpp>

#include "app/train/run_reports.hpp"
#include "test/support/process_groups.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;

namespace {
nlohmann::json only_line(const std::filesystem::path& p) {
  const std::string text = test::read_file(p);
  REQUIRE(std::count(text.begin(), text.end(), '\n') == 1);
  return nlohmann::json::parse(text);
}
}  // namespace

TEST_CASE("run reports: metrics.jsonl, memory_rank0.jsonl and bytes_rank0.jsonl lines", "[reports]") {
  test::TempDir d("run-reports");
  Recipe r;
  app::IterationStats s;
  s.iteration = 7;
  s.loss = 2.5;
  s.tokens_per_s = 1234;
  s.mem_weights = 4096;
  {
    app::MetricsWriter cpu(d.str() + "/cpu", true, parallel::Topology{1, 1, 1});
    cpu.write(s, r, 1.0);
    s.gemm_fallbacks = 3;  // a CUDA run's counter
    app::MetricsWriter gpu(d.str() + "/gpu", true, parallel::Topology{1, 1, 1});
    gpu.write(s, r, 1.0);
    app::MetricsWriter off(d.str() + "/off", false, parallel::Topology{1, 1, 1});  // not rank 0
    off.write(s, r, 1.0);
  }
  const nlohmann::json c = only_line(d.path() / "cpu" / "metrics.jsonl"), g = only_line(d.path() / "gpu" / "metrics.jsonl");
  CHECK(c["iteration"] == 7);
  CHECK(c["loss"] == 2.5);
  CHECK(c["tokens_per_s"] == 1234.0);
  CHECK_FALSE(c.contains("gemm_fallbacks"));
  CHECK_FALSE(c.contains("loss_scale"));  // fp16 only
  CHECK(g["gemm_fallbacks"] == 3);
  CHECK_FALSE(std::filesystem::exists(d.path() / "off" / "metrics.jsonl"));

  const parallel::ProcessGroups groups = test::single_process_groups();
  app::MemoryReport mem(d.str(), groups, true);
  mem.write(s);
  CHECK(only_line(d.path() / "memory_rank0.jsonl")["weights"] == 4096);
  app::CommReport comm(d.str(), groups, true);
  comm.reset();
  comm.write(7, 8, 2, 3, 1);
  const nlohmann::json b = only_line(d.path() / "bytes_rank0.jsonl");
  CHECK(b["micro_batches"] == 2);
  CHECK(b["dp_buckets_started_early"] == 1);
  CHECK(b["dp"] == 0);  // a group of one sends nothing
}
