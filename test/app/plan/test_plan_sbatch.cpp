// `mtnlg plan ... --sbatch FILE` through the binary: the script exists, is valid bash,
// its #SBATCH header and `--set` overrides match the planned layout (the recipe's, or
// the best one --search found), --time follows the prediction up to the 48 h cap, and
// a dry run (MTNLG_DRY_RUN=1) launches srun and requeues on exit 75. Bad paths exit 2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "test/support/test_support.hpp"

using namespace mtnlg::test;

namespace {

std::string recipe(const std::string& name) { return source_dir() + "/recipes/" + name; }

// #SBATCH directives before the first command line (what sbatch reads): key -> value.
std::map<std::string, std::string> directives(const std::string& text) {
  std::map<std::string, std::string> d;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') break;
    if (line.rfind("#SBATCH ", 0) != 0) continue;
    std::string opt = line.substr(8);
    opt = opt.substr(0, opt.find(' '));
    const auto eq = opt.find('=');
    d[opt.substr(0, eq)] = eq == std::string::npos ? "" : opt.substr(eq + 1);
  }
  return d;
}

RunResult dry_run(const TempDir& tmp, const std::string& script, const std::string& env) {
  return run_command("cd " + tmp.str() + " && env -u SLURM_JOB_NUM_NODES -u SLURM_NNODES SLURM_JOB_ID=4242 SHARED=" +
                     tmp.str() + "/shared MTNLG_ROOT=" + source_dir() + " MTNLG_DRY_RUN=1 " + env + " bash " + script);
}

// "--set key=value " as the script spells a layout override.
std::string fmt_set(const std::string& key, const std::string& value) { return "--set " + key + "=" + value + " "; }

int64_t slurm_seconds(const std::string& t) {  // H:MM:SS
  int64_t h = 0, m = 0, s = 0;
  char c1 = 0, c2 = 0;
  std::istringstream in(t);
  in >> h >> c1 >> m >> c2 >> s;
  REQUIRE((c1 == ':' && c2 == ':'));
  return h * 3600 + m * 60 + s;
}

}  // namespace

TEST_CASE("plan --sbatch writes a runnable script for the recipe's layout", "[e2e]") {
  TempDir tmp("plan-sbatch");
  const std::string file = (tmp / "530b.sbatch").string();
  auto r = run_mtnlg("plan " + recipe("mtnlg-530b.yaml") + " --gpus 2240 --gpu a100-80g --sbatch " + file);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("wrote " + file));
  const std::string text = read_file(file);
  CHECK(run_command("bash -n " + file).exit_code == 0);

  auto d = directives(text);
  CHECK(d["--nodes"] == "280");
  CHECK(d["--ntasks-per-node"] == "8");
  CHECK(d["--gpus-per-node"] == "8");
  CHECK(d["--signal"] == "USR1@600");
  CHECK(d.count("--requeue") == 1);
  CHECK(d["--output"] == "logs/%x-%j.out");
  CHECK(d["--time"] == "48:00:00");  // the 530B run takes weeks: capped, it requeues itself
  CHECK_THAT(text, Catch::Matchers::Contains("requeues itself"));
  for (const char* s : {"parallel.tensor_model_parallel_size=8 ", "parallel.pipeline_model_parallel_size=35 ",
                        "parallel.num_layers_per_virtual_pipeline_stage=0 ", "training.micro_batch_size=1 ",
                        "parallel.recompute_granularity=full ", "parallel.sequence_parallel=false ",
                        "parallel.use_distributed_optimizer=false "})
    CHECK_THAT(text, Catch::Matchers::Contains(std::string("--set ") + s));
  CHECK_THAT(text, Catch::Matchers::Contains("--stopped-exit-code 75"));

  // The dry run: srun with PMIx, checkpoints saved and loaded from one directory.
  auto ok = dry_run(tmp, file, "");
  INFO(ok.out);
  REQUIRE(ok.exit_code == 0);
  const std::string ckpt = tmp.str() + "/shared/checkpoints/mtnlg-530b";
  CHECK_THAT(ok.out, Catch::Matchers::Contains("world 2240 = tp 8 x pp 35 x dp 8"));
  CHECK_THAT(ok.out, Catch::Matchers::Contains("+ srun --mpi=pmix --kill-on-bad-exit=1"));
  CHECK_THAT(ok.out, Catch::Matchers::Contains(" train " + recipe("mtnlg-530b.yaml") + " --stopped-exit-code 75"));
  CHECK_THAT(ok.out, Catch::Matchers::Contains("--set checkpoint.save=" + ckpt));
  CHECK_THAT(ok.out, Catch::Matchers::Contains("--set checkpoint.load=" + ckpt));
  CHECK(ok.out.find("scontrol requeue") == std::string::npos);
  // Exit 75 (saved before the time limit) requeues; any other failure is passed on.
  auto saved = dry_run(tmp, file, "MTNLG_DRY_RUN_RC=75");
  CHECK(saved.exit_code == 0);
  CHECK_THAT(saved.out, Catch::Matchers::Contains("+ scontrol requeue 4242"));
  auto failed = dry_run(tmp, file, "MTNLG_DRY_RUN_RC=1");
  CHECK(failed.exit_code == 1);
  CHECK(failed.out.find("scontrol requeue") == std::string::npos);
  auto bad_nodes = dry_run(tmp, file, "SLURM_JOB_NUM_NODES=36");
  CHECK(bad_nodes.exit_code == 2);
  CHECK(bad_nodes.out.find("+ srun") == std::string::npos);
}

TEST_CASE("plan --search --sbatch sets every layout key the search chose", "[e2e]") {
  TempDir tmp("plan-sbatch-search");
  const std::string file = (tmp / "best.sbatch").string();
  auto r = run_mtnlg("plan " + recipe("mtnlg-530b.yaml") +
                     " --gpus 4096 --gpu h100-80g --search --top 1 --json --sbatch " + file + " 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);  // stdout stays one JSON object with --sbatch
  CHECK(j["sbatch"] == file);
  const auto& l = j["layout"];
  const std::string text = read_file(file);
  CHECK(run_command("bash -n " + file).exit_code == 0);
  auto d = directives(text);
  CHECK(d["--nodes"] == "512");
  CHECK(d["--ntasks-per-node"] == "8");
  const int64_t tp = l["tp"], pp = l["pp"], vp = l["virtual_stages"], cp = l["cp"];
  const int64_t per_virtual = vp > 1 ? 105 / pp / vp : 0;
  INFO(text);
  CHECK_THAT(text, Catch::Matchers::Contains(fmt_set("parallel.tensor_model_parallel_size", std::to_string(tp))));
  CHECK_THAT(text, Catch::Matchers::Contains(fmt_set("parallel.pipeline_model_parallel_size", std::to_string(pp))));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       fmt_set("parallel.num_layers_per_virtual_pipeline_stage", std::to_string(per_virtual))));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       fmt_set("training.micro_batch_size", std::to_string(l["micro_batch_size"].get<int64_t>()))));
  CHECK_THAT(text,
             Catch::Matchers::Contains(fmt_set("parallel.recompute_granularity", l["recompute"].get<std::string>())));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       fmt_set("parallel.sequence_parallel", l["sequence_parallel"].get<bool>() ? "true" : "false")));
  CHECK_THAT(text, Catch::Matchers::Contains(fmt_set("parallel.use_distributed_optimizer",
                                                     l["distributed_optimizer"].get<bool>() ? "true" : "false")));
  CHECK_THAT(text, Catch::Matchers::Contains(fmt_set("parallel.context_parallel_size", std::to_string(cp))));
  // dp in the dry run follows from the node count and the chosen tp x cp x pp.
  auto ok = dry_run(tmp, file, "");
  INFO(ok.out);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.out, Catch::Matchers::Contains("tp " + std::to_string(tp) + " x pp " + std::to_string(pp) + " x dp " +
                                               std::to_string(4096 / (tp * pp * cp)) + " x cp " + std::to_string(cp)));
}

TEST_CASE("plan --sbatch asks for the predicted time when it is under the cap", "[e2e]") {
  TempDir tmp("plan-sbatch-time");
  const std::string file = (tmp / "short.sbatch").string();
  auto r = run_mtnlg(
      "plan " + recipe("mtnlg-530b.yaml") +
      " --gpus 2240 --gpu a100-80g --set training.train_tokens=0 --set training.train_iters=100 --json --sbatch " +
      file + " 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  const double predicted = nlohmann::json::parse(r.out)["run"]["seconds"].get<double>();
  const std::string text = read_file(file);
  const int64_t limit = slurm_seconds(directives(text)["--time"]);
  // Prediction + 10% + 15 minutes, rounded up to a whole minute.
  CHECK(limit >= predicted * 1.1 + 900);
  CHECK(limit < predicted * 1.1 + 900 + 60);
  CHECK(limit < 48 * 3600);
  // The user's own --set reaches the training command too.
  CHECK_THAT(text, Catch::Matchers::Contains("--set training.train_iters=100 "));
}

TEST_CASE("plan --sbatch into a missing directory exits 2 with one line", "[e2e]") {
  TempDir tmp("plan-sbatch-bad");
  const std::string file = (tmp / "no-such-dir" / "x.sbatch").string();
  auto r = run_mtnlg("plan " + recipe("mtnlg-530b.yaml") + " --gpus 2240 --sbatch " + file);
  INFO(r.out);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Matchers::Contains("does not exist"));
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(file));
  // A directory in place of the file is refused too.
  auto dir = run_mtnlg("plan " + recipe("mtnlg-530b.yaml") + " --gpus 2240 --sbatch " + tmp.str());
  CHECK(dir.exit_code == 2);
}
