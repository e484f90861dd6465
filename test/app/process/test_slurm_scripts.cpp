// Checks of the Slurm batch scripts (scripts/slurm/*.sbatch) without a Slurm cluster:
// bash syntax, the #SBATCH directives sbatch will read (and that it reads them at all:
// sbatch stops at the first command line), the layout against the recipe, and the
// commands the script would run (MTNLG_DRY_RUN=1), including the requeue path.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "config/recipe.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::test;

namespace {

std::string script(const std::string& name) { return source_dir() + "/scripts/slurm/" + name; }

// The #SBATCH directives sbatch honours: those before the first line that is neither
// blank nor a comment. key -> value ("" for flags such as --exclusive).
std::map<std::string, std::string> sbatch_directives(const std::string& path, int64_t* ignored = nullptr) {
  std::ifstream in(path);
  REQUIRE(in);
  std::map<std::string, std::string> d;
  std::string line;
  bool in_header = true;
  int64_t late = 0;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    if (line[first] != '#') in_header = false;
    if (line.rfind("#SBATCH ", 0) != 0) continue;
    if (!in_header) {
      ++late;
      continue;
    }
    std::string opt = line.substr(8);
    opt = opt.substr(0, opt.find(' '));  // drop trailing comments
    const auto eq = opt.find('=');
    d[opt.substr(0, eq)] = eq == std::string::npos ? "" : opt.substr(eq + 1);
  }
  if (ignored) *ignored = late;
  return d;
}

RunResult dry_run(const TempDir& tmp, const std::string& name, const std::string& env) {
  return run_command("cd " + tmp.str() +
                     " && env -u SLURM_JOB_NUM_NODES -u SLURM_NNODES SLURM_JOB_ID=4242 SHARED=" + tmp.str() +
                     "/shared MTNLG_ROOT=" + source_dir() + " MTNLG_DRY_RUN=1 " + env + " bash " + script(name));
}

}  // namespace

TEST_CASE("the sbatch scripts are valid bash", "[slurm]") {
  for (const char* name : {"mtnlg-530b.sbatch", "small-multinode.sbatch"}) {
    auto r = run_command("bash -n " + script(name));
    INFO(name << ": " << r.out);
    CHECK(r.exit_code == 0);
  }
  // The check can fail: a script with a syntax error is caught.
  TempDir tmp("slurm-bad");
  write_file(tmp / "bad.sbatch", "#!/bin/bash\nif true; then\n  echo x\n");
  CHECK(run_command("bash -n " + (tmp / "bad.sbatch").string()).exit_code != 0);
}

TEST_CASE("the 530B script asks for the paper's layout and the preemption settings", "[slurm]") {
  int64_t late = -1;
  auto d = sbatch_directives(script("mtnlg-530b.sbatch"), &late);
  CHECK(late == 0);  // every #SBATCH line is where sbatch reads it
  CHECK(d["--nodes"] == "280");
  CHECK(d["--ntasks-per-node"] == "8");
  CHECK(d["--gpus-per-node"] == "8");
  CHECK(d.count("--cpus-per-task") == 1);
  CHECK(d.count("--time") == 1);
  CHECK(d.count("--exclusive") == 1);
  CHECK(d.count("--requeue") == 1);
  CHECK(d["--signal"] == "USR1@600");
  CHECK(d["--output"] == "logs/%x-%j.out");

  // 280 nodes x 8 GPUs = tp x pp x dp with the recipe's tp and pp, dp = 8.
  Recipe r = load_recipe(source_dir() + "/recipes/mtnlg-530b.yaml");
  const int64_t world = std::stoll(d["--nodes"]) * std::stoll(d["--ntasks-per-node"]);
  const int64_t model_parallel = r.parallel.tensor_model_parallel_size * r.parallel.pipeline_model_parallel_size;
  CHECK(model_parallel == 280);
  REQUIRE(world % model_parallel == 0);
  CHECK(world / model_parallel == 8);
  CHECK(r.training.global_batch_size % (world / model_parallel * r.training.micro_batch_size) == 0);
}

TEST_CASE("the small multi-node script is 2 nodes of 8 GPUs at tp 8", "[slurm]") {
  int64_t late = -1;
  auto d = sbatch_directives(script("small-multinode.sbatch"), &late);
  CHECK(late == 0);
  CHECK(d["--nodes"] == "2");
  CHECK(d["--ntasks-per-node"] == "8");
  CHECK(d["--gpus-per-node"] == "8");
  CHECK(d.count("--requeue") == 1);
  CHECK(d["--signal"].rfind("USR1@", 0) == 0);
  CHECK(d["--output"] == "logs/%x-%j.out");
}

TEST_CASE("the 530B script launches mtnlg through srun with PMIx and resumable checkpoints", "[slurm]") {
  TempDir tmp("slurm-dry");
  auto r = dry_run(tmp, "mtnlg-530b.sbatch", "");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const std::string ckpt = tmp.str() + "/shared/checkpoints/mtnlg-530b";
  CHECK_THAT(r.out, Catch::Matchers::Contains("world 2240 = tp 8 x pp 35 x dp 8"));
  CHECK_THAT(r.out, Catch::Matchers::Contains("+ srun --mpi=pmix"));
  CHECK_THAT(r.out, Catch::Matchers::Contains(" train " + source_dir() + "/recipes/mtnlg-530b.yaml"));
  CHECK_THAT(r.out, Catch::Matchers::Contains("--set checkpoint.save=" + ckpt));
  CHECK_THAT(r.out, Catch::Matchers::Contains("--set checkpoint.load=" + ckpt));
  CHECK_THAT(r.out, Catch::Matchers::Contains("--set logging.dir=" + tmp.str() + "/shared/runs/mtnlg-530b"));
  CHECK(std::filesystem::is_directory(ckpt));
  CHECK(r.out.find("scontrol requeue") == std::string::npos);
}

TEST_CASE("the sbatch scripts requeue after a signal-triggered save and pass failures on", "[slurm]") {
  TempDir tmp("slurm-requeue");
  for (const char* name : {"mtnlg-530b.sbatch", "small-multinode.sbatch"}) {
    INFO(name);
    auto saved = dry_run(tmp, name, "MTNLG_DRY_RUN_RC=75");
    INFO(saved.out);
    CHECK(saved.exit_code == 0);
    CHECK_THAT(saved.out, Catch::Matchers::Contains("+ scontrol requeue 4242"));
    auto failed = dry_run(tmp, name, "MTNLG_DRY_RUN_RC=1");
    CHECK(failed.exit_code == 1);
    CHECK(failed.out.find("scontrol requeue") == std::string::npos);
  }
  // A node count that cannot hold whole model replicas stops before launching anything.
  auto bad = dry_run(tmp, "mtnlg-530b.sbatch", "SLURM_JOB_NUM_NODES=36");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out, Catch::Matchers::Contains("not a multiple of tp*pp = 280"));
  CHECK(bad.out.find("+ srun") == std::string::npos);
}
