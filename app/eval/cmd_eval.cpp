// `mtnlg eval`: zero/one/few-shot evaluation the lm-evaluation-harness way
// (docs/specs/eval-harness.md; command line in interface.md "Eval"). The work is in
// app/eval/eval_runner.cpp; this file parses options, writes results.json / samples.jsonl
// (atomically: core/atomic_file.hpp) and prints the harness's table.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/commands.hpp"
#include "app/eval/eval_parallel.hpp"
#include "app/eval/eval_runner.hpp"
#include "app/eval/tokenizer_options.hpp"
#include "app/process/device_watchdog.hpp"
#include "app/process/placement.hpp"
#include "app/process/preflight.hpp"
#include "model/checkpoint.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "parallel/watchdog.hpp"
#include "core/log.hpp"

namespace mtnlg::app {

namespace {

struct EvalArgs {
  std::string checkpoint, random_init, tasks, data_dir, output, log_samples, harness = "0.3", lambada = "plain";
  std::string device = "auto";
  TokenizerOptions tok;
  std::vector<std::string> sets, task_fewshot;
  int64_t num_fewshot = 0, limit = -1, batch_size = 8, max_length = 0, bootstrap_iters = 100000;
  bool no_progress = false;
};

// The command line as evaluation options (each mistake one line, exit 2, before any work).
EvalOptions eval_options(const EvalArgs& a) {
  // Found before an evaluation that may take hours, not after it.
  if (!a.output.empty()) check_writable_file(a.output, "--output");
  if (!a.log_samples.empty()) check_writable_file(a.log_samples, "--log-samples");
  EvalOptions o;
  // tasks: comma-separated, or "all"
  std::stringstream ss(a.tasks);
  for (std::string t; std::getline(ss, t, ',');) {
    if (t.empty()) continue;
    if (t == "all") {
      for (auto& n : data::eval::task_names()) o.tasks.push_back(n);
      continue;
    }
    data::eval::task_info(t);  // exit 2 listing the valid tasks
    o.tasks.push_back(t);
  }
  if (o.tasks.empty()) throw_input("--tasks: no task given");
  for (auto& tf : a.task_fewshot) {
    auto eq = tf.find('=');
    if (eq == std::string::npos) throw_input("--task-fewshot '{}': expected TASK=K", tf);
    const std::string name = tf.substr(0, eq);
    data::eval::task_info(name);
    try {
      o.task_fewshot[name] = std::stoll(tf.substr(eq + 1));
    } catch (const std::exception&) {
      throw_input("--task-fewshot '{}': K must be an integer", tf);
    }
  }
  if (a.harness == "0.3" || a.harness == "v0.3")
    o.task_opt.version = data::eval::HarnessVersion::v0_3;
  else if (a.harness == "0.4" || a.harness == "v0.4")
    o.task_opt.version = data::eval::HarnessVersion::v0_4;
  else
    throw_input("--harness-version '{}': valid values are 0.3, 0.4", a.harness);
  if (a.lambada == "plain")
    o.task_opt.lambada_format = data::eval::LambadaFormat::plain;
  else if (a.lambada == "cloze")
    o.task_opt.lambada_format = data::eval::LambadaFormat::cloze;
  else
    throw_input("--lambada-format '{}': valid values are plain, cloze", a.lambada);
  if (a.num_fewshot < 0) throw_input("--num-fewshot must be >= 0, got {}", a.num_fewshot);
  if (a.batch_size < 1) throw_input("--batch-size must be >= 1, got {}", a.batch_size);
  if (!std::filesystem::is_directory(a.data_dir)) throw_input("--data-dir {}: not a directory", a.data_dir);
  o.data_dir = a.data_dir;
  o.num_fewshot = a.num_fewshot;
  o.limit = a.limit;
  o.batch_size = a.batch_size;
  o.max_length = a.max_length;
  o.bootstrap_iters = a.bootstrap_iters;
  o.progress = !a.no_progress;
  o.model_args = a.checkpoint.empty() ? "random_init=" + a.random_init : "checkpoint=" + a.checkpoint;
  return o;
}

// Under mpirun/srun: the checkpoint's model split tp x pp across the ranks
// (--set parallel.tensor_model_parallel_size=... chooses the layout). False on the ranks
// other than 0, which neither print nor write.
bool run_parallel_eval(const EvalArgs& a, const parallel::LaunchInfo& launch, const EvalOptions& o,
                       const data::TextTokenizer& tok, EvalReport& rep) {
  InferenceWorld iw = start_inference_world("eval", a.checkpoint, a.sets, launch);
  const Recipe& r = iw.recipe;
  const std::string& dir = iw.dir;
  auto& world = iw.world;
  try {
    const Device dev = select_device(parse_device_kind(a.device, "--device"), "--device");
    // On CUDA the tensor groups are NCCL's, under the device watchdog as in training: a
    // collective that hangs or fails ends every rank with exit 3, its flight recorder
    // dumped into logging.dir and the verdict naming the rank.
    const auto groups = parallel::place_groups(
        parallel::make_groups(world, parallel::Topology::from_world(launch.world_size, r.tp(), r.pp())), dev);
    DeviceWatchdogRun watchdog(r.logging.dir, groups, r.parallel.heartbeat_timeout_minutes * 60);
    ParallelScorer scorer(r, dir, groups, dev);
    log::info("eval: {} split tp={} pp={} over {} ranks", dir, r.tp(), r.pp(), launch.world_size);
    rep = run_eval(scorer.config(), std::ref(scorer), tok, o);
  } catch (const Error& e) {
    std::fprintf(stderr, "mtnlg: error on rank %lld: %s\n", static_cast<long long>(launch.rank), e.what());
    std::fflush(stderr);
    parallel::abort_world(e.exit_code());
  }
  parallel::finalize_world();
  return launch.rank == 0;
}

void run(const EvalArgs& a) {
  const EvalOptions o = eval_options(a);
  // The harness encodes contexts and continuations without special tokens.
  auto tok = a.tok.load(a.checkpoint, a.random_init, a.sets, /*add_special_tokens=*/false);
  EvalReport rep;
  const parallel::LaunchInfo launch = parallel::detect_launch();
  if (launch.world_size > 1) {
    if (!run_parallel_eval(a, launch, o, *tok, rep)) return;
  } else {
    model::LoadedModel lm = load_eval_model(a.checkpoint, a.random_init, a.sets);
    lm.store.place(select_device(parse_device_kind(a.device, "--device"), "--device"));
    auto chunk = model::whole_model_chunk(lm.cfg, lm.store);
    rep = run_eval(*chunk, *tok, o);
  }
  std::fputs(results_table(rep).c_str(), stdout);
  log::info("{} requests in {:.1f} s ({:.1f} requests/s)", rep.requests, rep.seconds,
            rep.seconds > 0 ? static_cast<double>(rep.requests) / rep.seconds : 0.0);
  if (!a.output.empty()) write_file_atomic(a.output, results_json(rep, o).dump(2) + "\n");
  if (!a.log_samples.empty()) {
    std::string text;
    for (auto& t : rep.tasks)
      for (auto& s : t.samples) text += s.dump() + "\n";
    write_file_atomic(a.log_samples, text);
  }
}

}  // namespace

void register_eval(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("eval", "Zero/one/few-shot evaluation the lm-evaluation-harness way (v0.3 by default)");
  static EvalArgs a;
  cmd->add_option("--checkpoint", a.checkpoint, "Checkpoint directory to evaluate");
  cmd->add_option("--random-init", a.random_init,
                  "Testing aid: evaluate a model with random weights built from this recipe's model section");
  cmd->add_option("--set", a.sets,
                  "Override a recipe key, section.key=value; repeatable: with --random-init that recipe's, under "
                  "mpirun/srun the checkpoint's (parallel.* for the layout, parallel.distributed_timeout_minutes, "
                  "logging.dir for the flight recorder)");
  cmd->add_option("--device", a.device,
                  "Where the model runs: auto (the GPU of this process's local rank when there is one, else the CPU), "
                  "cpu, cuda, or test (the CI test device)")
      ->capture_default_str();
  cmd->add_option("--tasks", a.tasks,
                  "Comma-separated tasks: lambada_openai, boolq, race_high, piqa, hellaswag, winogrande, anli_r2, "
                  "hans, wic; or all")
      ->required();
  cmd->add_option("--data-dir", a.data_dir, "Directory with <task>/<split>.jsonl Hugging Face exports (docs/EVAL.md)")
      ->required();
  cmd->add_option("--num-fewshot", a.num_fewshot, "Few-shot examples per document (all tasks)")->capture_default_str();
  cmd->add_option("--task-fewshot", a.task_fewshot,
                  "Per-task few-shot count TASK=K, overriding --num-fewshot; repeatable");
  cmd->add_option("--harness-version", a.harness, "Harness semantics to reproduce: 0.3 (MT-NLG era) or 0.4")
      ->capture_default_str();
  cmd->add_option("--lambada-format", a.lambada,
                  "LAMBADA prompt: plain or cloze (\" ____. ->\", GPT-3's few-shot format)")
      ->capture_default_str();
  cmd->add_option("--limit", a.limit, "Evaluate only the first N documents of each task (after the v0.3 shuffle)");
  cmd->add_option("--batch-size", a.batch_size, "Requests per forward pass")->capture_default_str();
  cmd->add_option("--max-length", a.max_length, "Context window in tokens (default: the model's seq_length)");
  cmd->add_option("--bootstrap-iters", a.bootstrap_iters, "Bootstrap replicates for the perplexity stderr")
      ->capture_default_str();
  cmd->add_option("--output", a.output, "Write the results JSON (harness v0.3 shape) to this file");
  cmd->add_option("--log-samples", a.log_samples, "Write one JSON line per evaluated document to this file");
  a.tok.add_to(cmd,
               "; contexts and "
               "continuations are encoded without its special tokens, as the harness does",
               "With --tokenizer: the end-of-text token (an empty context is this token); default: eos_token of the "
               "tokenizer_config.json beside it");
  cmd->add_flag("--no-progress", a.no_progress, "Do not draw the progress bar");
  cmd->footer(
      "Under mpirun/srun the checkpoint's model is split tp x pp over the ranks (--set "
      "parallel.tensor_model_parallel_size=... and pipeline_model_parallel_size=...). Collective watchdog: the "
      "checkpoint recipe's parallel.distributed_timeout_minutes (default 10, fractions accepted; --set overrides it, "
      "MTNLG_COLLECTIVE_TIMEOUT=seconds overrides both, 0 = off) bounds every host collective and, on GPUs, every NCCL "
      "operation: one pending longer, an NCCL asynchronous error or a dead peer aborts the NCCL communicators, dumps "
      "each rank's flight recorder to LOGDIR/flight_recorder/rank<R>.json (LOGDIR: the recipe's logging.dir, --set "
      "logging.dir=DIR to choose), names the culprit rank and collective in LOGDIR/flight_recorder/report.txt "
      "(`mtnlg report --explain LOGDIR` too) and exits with status 3 on every rank. See docs/RELIABILITY.md.\n"
      "Testing aid: MTNLG_FAULT_INJECT=rank=R:iteration=I:mode=hang makes global rank R stop entering NCCL "
      "collectives at eval batch I (under mpirun; other modes are exit 2).");
  cmd->callback([] { run(a); });
}

}  // namespace mtnlg::app
