// `mtnlg train RECIPE [--set section.key=value ...]`: one process per device, started
// plainly (world 1), by `mpirun -np N` or by Slurm `srun` (see parallel/communicator.hpp
// for launcher discovery). Bad input exits 2 before anything is allocated; a fault on
// one rank ends every rank (MPI_Abort) so no peer waits forever in a collective.
#include <cstdio>
#include <cstdlib>

#include "app/commands.hpp"
#include "app/train/trainer.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "config/recipe.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::app {

namespace {
struct TrainArgs {
  std::string recipe;
  std::vector<std::string> sets;
  bool quiet = false;
  bool comm_report = false;
  bool memory_report = false;
  int stopped_exit_code = 0;
};

// `train --help`'s footer: what the run does beyond the recipe's keys.
const char* train_footer() {
  return "Checkpoints: checkpoint.load resumes (a directory without a checkpoint starts fresh); SIGTERM, SIGUSR1, "
         "SIGHUP "
         "and a first Ctrl-C save at the next iteration boundary and exit (see --stopped-exit-code; a second Ctrl-C "
         "ends the process; with no checkpoint.save the run exits 1). See docs/RELIABILITY.md.\n"
         "Collective watchdog: a host-side collective or transfer waiting longer than "
         "parallel.distributed_timeout_minutes (default 10; MTNLG_COLLECTIVE_TIMEOUT=seconds overrides, 0 = off) ends "
         "the job, naming the rank that did not arrive. On GPUs (NCCL groups, more than one process) a device "
         "watchdog thread does the same for NCCL operations: one pending longer than the timeout, an NCCL asynchronous "
         "error or a dead peer aborts every NCCL communicator, dumps each rank's flight recorder (its last operations) "
         "to LOGDIR/flight_recorder/rank<R>.json, names the culprit rank and collective in "
         "LOGDIR/flight_recorder/report.txt (`mtnlg report --explain LOGDIR` reads the dumps too) and exits with "
         "status "
         "3 on every rank; SIGUSR1 also writes a live dump. See docs/RELIABILITY.md.\n"
         "Spike and NaN forensics: training.check_for_nan_in_loss_and_grad, training.loss_spike_threshold (with "
         "loss_spike_window) replay a step with a non-finite loss or gradient or a loss spike, classify it persistent "
         "(naming samples, sources, documents and the first non-finite layer) or transient (naming the rank), and act "
         "by "
         "training.spike_policy (stop|skip|rerun); training.param_hash_interval compares the data-parallel replicas' "
         "parameters. Events go to LOGDIR/forensics.jsonl. See docs/RELIABILITY.md.\n"
         "CUDA graphs: training.enable_cuda_graph runs each micro batch's forward and backward on the GPU as two "
         "graphs "
         "(captured after one eager micro batch per shape, then replayed); one pipeline stage (any tensor and data "
         "parallel size), no "
         "spike forensics, else exit 2. The log line counts the launches (graph replays). See docs/RECIPES.md.\n"
         "Testing aid: "
         "MTNLG_FAULT_INJECT=rank=R:iteration=I:mode=throw|abort|kill|stop|hang|sigterm|sigusr1|nan|overflow|"
         "slow|bitflip_grad|bitflip_param|poison makes global rank R, at the start of iteration I, throw an error, "
         "abort(), "
         "SIGKILL or SIGSTOP itself, stop entering NCCL collectives (hang), raise SIGTERM/SIGUSR1, or (nan) produce "
         "non-finite gradients from then on, or "
         "(overflow) +inf gradients at that iteration, or (slow, with :ms=N, default 300) sleep N ms at the start of "
         "every "
         "iteration from then on (a straggler), or (bitflip_grad, bitflip_param, with :bit=N, default 30) flip one bit "
         "of "
         "its gradient after the data-parallel reduction or of its parameters, or (poison, with :layer=L, default 0; "
         "-1 "
         "the embedding) make layer L's output non-finite for its first micro batch.";
}

// One rank's training run: the recipe loaded and checked, the process group formed, the
// run, and the exit status the job script reads when it stopped early.
void run_train(const TrainArgs& a) {
  Recipe r = load_recipe(a.recipe, a.sets);  // InputError -> exit 2 before any process group exists
  refuse_unwired_moe(r);
  parallel::LaunchInfo info = parallel::detect_launch();
  validate_layout(r, info.world_size);
  parallel::set_collective_timeout(r.parallel.distributed_timeout_minutes * 60);  // MTNLG_COLLECTIVE_TIMEOUT wins
  auto world = parallel::init_world(info);
  log::context().rank = static_cast<int>(info.rank);
  log::context().world = static_cast<int>(info.world_size);
  log::context().quiet = a.quiet;
  bool interrupted = false;
  try {
    auto topo = parallel::Topology::from_world(info.world_size, r.tp(), r.pp(), r.cp());
    auto groups = parallel::make_groups(world, topo);
    TrainOptions opts;
    opts.quiet = a.quiet;
    opts.comm_report = a.comm_report;
    opts.memory_report = a.memory_report;
    interrupted = train(r, groups, opts).interrupted;
  } catch (const Error& e) {
    if (info.world_size > 1) {
      std::fprintf(stderr, "mtnlg: error on rank %lld: %s\n", static_cast<long long>(info.rank), e.what());
      std::fflush(stderr);
      parallel::abort_world(e.exit_code());
    }
    throw;
  } catch (const std::exception& e) {
    if (info.world_size > 1) {
      std::fprintf(stderr, "mtnlg: error on rank %lld: %s\n", static_cast<long long>(info.rank), e.what());
      std::fflush(stderr);
      parallel::abort_world(1);
    }
    throw;
  }
  parallel::finalize_world();
  if (interrupted && a.stopped_exit_code != 0) {  // saved and stopped early: tell the job script
    std::fflush(nullptr);
    std::exit(a.stopped_exit_code);
  }
}

}  // namespace

void register_train(CLI::App& app) {
  static TrainArgs a;
  auto* cmd = app.add_subcommand("train", "Train a GPT from a recipe (single process, mpirun -np N, or srun)");
  cmd->add_option("recipe", a.recipe, "Recipe YAML file (see recipes/ and docs/RECIPES.md)")->required();
  cmd->add_option(
      "--set", a.sets,
      "Override a recipe key: section.key=value, value parsed as YAML (e.g. --set training.train_iters=100); "
      "repeatable, applied after the file");
  cmd->add_flag("--quiet", a.quiet, "Only errors on the console (metrics.jsonl is still written)");
  cmd->add_option("--stopped-exit-code", a.stopped_exit_code,
                  "Exit status when the run stopped early after saving a checkpoint (SIGTERM, SIGUSR1, "
                  "training.exit_duration_mins); default 0. The sbatch templates pass 75 to requeue the job")
      ->check(CLI::Range(0, 125));
  cmd->add_flag("--comm-report", a.comm_report,
                "Every rank writes the bytes it sent per group (tp, pp, dp, embedding, mp, world) each iteration to "
                "LOGDIR/bytes_rank<R>.jsonl (ring-model bytes, see docs/PLANNER.md)");
  cmd->add_flag(
      "--memory-report", a.memory_report,
      "Every rank writes its tensor bytes by role (weights, grads, optimizer, activations, workspace) each "
      "iteration to LOGDIR/memory_rank<R>.jsonl (compare with `mtnlg plan --software mtnlg`, docs/PLANNER.md)");
  cmd->footer(train_footer());
  cmd->callback([] { run_train(a); });
}

}  // namespace mtnlg::app
