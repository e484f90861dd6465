// `mtnlg generate`: text continuation through GptChunk's forward with a KV cache
// (model::generate, model/inference.hpp). Greedy or
// sampled (temperature, top-k, top-p), seeded; stops at <|endoftext|> or after
// --max-new-tokens. The prompt is plain text (e.g. the MT-NLG blog's few-shot prompts
// with '#' separated examples) from --prompt or --prompt-file. Under mpirun/srun the
// checkpoint's model is split over the ranks by tensor parallelism (world = tp; pp = 1):
// every rank runs the same decode (the vocab-parallel head gathers the full logits, so
// every rank samples the same token) and rank 0 prints; on CUDA the tensor group is
// NCCL's, under the device watchdog as in training and eval.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>

#include "app/commands.hpp"
#include "app/eval/eval_runner.hpp"
#include "app/eval/tokenizer_options.hpp"
#include "app/process/device_watchdog.hpp"
#include "app/process/module_configs.hpp"
#include "app/process/placement.hpp"
#include "app/train/fault_injection.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "model/checkpoint.hpp"
#include "model/inference.hpp"
#include "model/partition.hpp"
#include "parallel/flight_recorder.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::app {

namespace {

struct GenArgs {
  std::string checkpoint, random_init, prompt, prompt_file;
  TokenizerOptions tok;
  std::vector<std::string> sets;
  model::SamplingOptions s;
  std::string device = "auto";
  bool echo = true, timing = false;
};

std::string read_prompt(const GenArgs& a) {
  if (a.prompt.empty() == a.prompt_file.empty() && !(a.prompt.empty() && a.prompt_file.empty()))
    throw_input("give either --prompt or --prompt-file, not both");
  std::string prompt = a.prompt;
  if (!a.prompt_file.empty()) {
    std::ifstream f(a.prompt_file, std::ios::binary);
    if (!f) throw_input("--prompt-file {}: cannot read", a.prompt_file);
    std::stringstream ss;
    ss << f.rdbuf();
    prompt = ss.str();
  }
  if (a.s.max_new_tokens < 0) throw_input("--max-new-tokens must be >= 0, got {}", a.s.max_new_tokens);
  if (a.s.temperature < 0) throw_input("--temperature must be >= 0, got {}", a.s.temperature);
  if (a.s.top_p <= 0 || a.s.top_p > 1) throw_input("--top-p must be in (0, 1], got {}", a.s.top_p);
  if (a.s.top_k < 0) throw_input("--top-k must be >= 0, got {}", a.s.top_k);
  return prompt;
}

// Generates from `chunk` and (`print`: rank 0, or a single process) prints as it goes;
// `on_token` (optional) runs first for every token (the watchdog's context).
void decode(model::GptChunk& chunk, const data::TextTokenizer& tok, const GenArgs& a, const std::string& prompt,
            bool print, const std::function<void(int64_t)>& on_token = {}) {
  model::SamplingOptions s = a.s;
  s.stop_token = tok.eod();
  std::vector<int32_t> ids = tok.encode(prompt);
  if (print && a.echo) std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto t1 = t0;
  std::clock_t c1 = std::clock();  // process CPU time, all threads: steadier than wall time on a loaded machine
  int64_t n = 0;
  // Printed as it comes: the decode of all tokens so far, less what is printed, held back
  // while it ends in U+FFFD (a character whose bytes are split across tokens).
  std::vector<int32_t> out_ids;
  size_t printed = 0;
  model::generate(chunk, ids, s, [&](int32_t t) {
    if (on_token) on_token(n);
    if (n++ == 0) t1 = Clock::now(), c1 = std::clock();
    if (t == s.stop_token || !print) return;
    out_ids.push_back(t);
    const std::string text = tok.decode(out_ids);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    if (text.size() > printed) std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
    printed = std::max(printed, text.size());
    std::fflush(stdout);
  });
  if (!print) return;
  if (!out_ids.empty()) {  // what was held back at the end
    const std::string text = tok.decode(out_ids);
    if (text.size() > printed) std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
  }
  std::fputc('\n', stdout);
  if (a.timing) {  // prefill (+ the first token), then the decode steps
    const double pre = std::chrono::duration<double>(t1 - t0).count();
    const double dec = std::chrono::duration<double>(Clock::now() - t1).count();
    const double cpu = static_cast<double>(std::clock() - c1) / CLOCKS_PER_SEC;
    const double more = static_cast<double>(n > 0 ? n - 1 : 0);
    std::fprintf(stderr,
                 "generate: prompt of %zu tokens + first token in %.3f s; %.0f more tokens in %.3f s (%.2f tokens/s), "
                 "%.3f CPU s (%.2f tokens per CPU second)\n",
                 ids.size(), pre, more, dec, dec > 0 ? more / dec : 0.0, cpu, cpu > 0 ? more / cpu : 0.0);
  }
}

// The checkpoint's model split tp ways over the world (pp = 1), every rank decoding; on
// CUDA under the device watchdog, the decode step standing where training's iteration does
// (MTNLG_FAULT_INJECT=rank=R:iteration=I:mode=hang: rank R stops entering collectives at
// token I, the testing aid).
void run_parallel(const GenArgs& a, const parallel::LaunchInfo& launch, const data::TextTokenizer& tok,
                  const std::string& prompt) {
  const FaultInjection fault = fault_injection_from_env();
  if (fault.active() && fault.mode != "hang")
    throw_input("MTNLG_FAULT_INJECT mode={}: generate takes only mode=hang (its iteration counts tokens)", fault.mode);
  InferenceWorld iw = start_inference_world("generate", a.checkpoint, a.sets, launch, [&](const Recipe& r) {
    if (r.pp() != 1 || r.tp() != launch.world_size)
      throw_input(
          "generate under mpirun/srun splits the model by tensor parallelism only: the world size ({}) must "
          "equal parallel.tensor_model_parallel_size ({}) with parallel.pipeline_model_parallel_size 1 ({})",
          launch.world_size, r.tp(), r.pp());
  });
  const Recipe& r = iw.recipe;
  const std::string& dir = iw.dir;
  auto& world = iw.world;
  try {
    const Device dev = select_device(parse_device_kind(a.device, "--device"), "--device");
    const auto g = parallel::place_groups(
        parallel::make_groups(world, parallel::Topology::from_world(launch.world_size, r.tp(), 1)), dev);
    DeviceWatchdogRun watchdog(r.logging.dir, g, r.parallel.heartbeat_timeout_minutes * 60);
    const model::GptConfig cfg = parallel_inference_config(r);
    model::ParamStore store;
    model::declare_chunk_params(store, cfg, model::ChunkSpec{0, cfg.num_layers_total, true, true, ""}, g.coord.tp,
                                g.topo.tp());
    store.finalize(DType::f32, DType::f32, dev);
    model::ckpt::load_into(dir, store);
    auto chunk = model::whole_model_chunk(cfg, store, g);
    decode(*chunk, tok, a, prompt, launch.rank == 0, [&](int64_t n) {
      parallel::device_watchdog().set_iteration(n + 1);
      parallel::device_watchdog().set_phase(-1, -1, "decode");
      if (fault.mode == "hang" && fault.rank == launch.rank && fault.iteration == n + 1)
        parallel::device_watchdog().inject_hang();
    });
  } catch (const Error& e) {
    std::fprintf(stderr, "mtnlg: error on rank %lld: %s\n", static_cast<long long>(launch.rank), e.what());
    std::fflush(stderr);
    parallel::abort_world(e.exit_code());
  }
  parallel::finalize_world();
}

void run(const GenArgs& a) {
  const std::string prompt = read_prompt(a);
  // A tokenizer.json prompt gets the file's special tokens (BOS), as transformers encodes it.
  auto tok = a.tok.load(a.checkpoint, a.random_init, a.sets, /*add_special_tokens=*/true);
  const parallel::LaunchInfo launch = parallel::detect_launch();
  if (launch.world_size > 1) return run_parallel(a, launch, *tok, prompt);
  model::LoadedModel lm = load_eval_model(a.checkpoint, a.random_init, a.sets);
  lm.store.place(select_device(parse_device_kind(a.device, "--device"), "--device"));
  auto chunk = model::whole_model_chunk(lm.cfg, lm.store);
  decode(*chunk, *tok, a, prompt, true);
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a trained model (KV cache; greedy or sampled)");
  static GenArgs a;
  cmd->add_option("--checkpoint", a.checkpoint, "Checkpoint directory");
  cmd->add_option("--random-init", a.random_init, "Testing aid: a model with random weights from this recipe");
  cmd->add_option("--device", a.device,
                  "Where the model runs: auto (the GPU when there is one, else the CPU), cpu, cuda, or test (the CI "
                  "test device)")
      ->capture_default_str();
  cmd->add_option("--prompt", a.prompt, "Prompt text");
  cmd->add_option("--prompt-file", a.prompt_file, "Read the prompt from this file (as is, newlines included)");
  cmd->add_option("--max-new-tokens", a.s.max_new_tokens, "Most tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", a.s.temperature, "Softmax temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", a.s.top_k, "Sample from the k most likely tokens (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", a.s.top_p, "Nucleus sampling: smallest set with probability mass >= p (1 = off)")
      ->capture_default_str();
  cmd->add_option("--seed", a.s.seed, "Sampling seed (same seed, same text)")->capture_default_str();
  cmd->add_flag("--greedy", a.s.greedy, "Always take the most likely token");
  cmd->add_flag("!--no-echo", a.echo, "Print only the generated text, not the prompt");
  cmd->add_flag("--timing", a.timing, "Print the prefill time and the decode speed (tokens/s) to stderr");
  a.tok.add_to(cmd,
               ": the prompt gets "
               "its BOS where the file's template adds one, and the text is its decoder's",
               "With --tokenizer: the token that stops generation (default: eos_token of the tokenizer_config.json "
               "beside it)");
  cmd->add_option("--set", a.sets,
                  "Override a recipe key, section.key=value; repeatable: with --random-init that recipe's, under "
                  "mpirun/srun the checkpoint's (parallel.tensor_model_parallel_size for the split, "
                  "parallel.distributed_timeout_minutes, logging.dir for the watchdog's flight recorder)");
  cmd->footer(
      "One process: the whole model on one device. Under mpirun/srun (-np N): the checkpoint's model split by tensor "
      "parallelism over the N ranks (--set parallel.tensor_model_parallel_size=N; no pipeline split), every rank "
      "decoding the same tokens and rank 0 printing; on CUDA its NCCL group is under the device watchdog "
      "(parallel.distributed_timeout_minutes: a hung collective ends every rank with exit 3 and a flight recorder "
      "in logging.dir, docs/RELIABILITY.md).");
  cmd->callback([] { run(a); });
}

}  // namespace mtnlg::app
