// The eval runner behind `mtnlg eval`: loads the tasks' JSONL splits, builds the
// harness's few-shot contexts, turns every (context, continuation) into a windowed
// loglikelihood request, scores all requests of all tasks sorted longest first in
// batches (model/inference.hpp), and aggregates the harness metrics into the v0.3
// results JSON, a per-sample log and a console table.
//
// Model acquisition is separate (load_eval_model): `--random-init RECIPE` builds a
// random-weight model (a testing aid); `--checkpoint DIR` goes through the checkpoint
// loader (app::load_for_inference, app/process/module_configs.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/recipe.hpp"
#include "data/eval/tasks.hpp"
#include "data/text_tokenizer.hpp"
#include "model/inference.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

struct EvalOptions {
  std::vector<std::string> tasks;
  std::string data_dir;
  int64_t num_fewshot = 0;
  std::map<std::string, int64_t> task_fewshot;  // per-task override of num_fewshot
  data::eval::TaskOptions task_opt;
  int64_t limit = -1;      // < 0: all documents
  int64_t batch_size = 8;  // requests per forward
  int64_t max_length = 0;  // window; 0 = the model's seq_length
  int64_t bootstrap_iters = 100000;
  std::string model_desc = "mtnlg";  // results.json config.model / model_args
  std::string model_args;
  bool progress = true;
};

struct TaskResult {
  std::string name;
  int version = 0;
  int64_t num_fewshot = 0;
  int64_t n_docs = 0, n_original = 0;
  nlohmann::ordered_json metrics;               // v0.3 keys: acc, acc_stderr, acc_norm, ..., ppl, ppl_stderr
  std::vector<nlohmann::ordered_json> samples;  // per-document log lines
};

struct EvalReport {
  std::vector<TaskResult> tasks;
  int64_t requests = 0;
  double seconds = 0;
};

// Scores one batch of loglikelihood requests (in-process model, or the ranks of a
// tensor/pipeline-parallel job together: app/eval/eval_parallel.hpp).
using ScoreFn = std::function<std::vector<model::ScoreResult>(const std::vector<const model::ScoreRequest*>&)>;

// In-process scoring through `model` (the whole model: model::whole_model_chunk).
EvalReport run_eval(model::GptChunk& model, const data::TextTokenizer& tok, const EvalOptions& opt);
EvalReport run_eval(const model::GptConfig& cfg, const ScoreFn& score, const data::TextTokenizer& tok,
                    const EvalOptions& opt);
inline EvalReport run_eval(model::GptChunk& model, const data::Tokenizer& tok, const EvalOptions& opt) {
  return run_eval(
      model,
      data::Gpt2TextTokenizer(std::shared_ptr<const data::Tokenizer>(std::shared_ptr<const data::Tokenizer>(), &tok)),
      opt);
}

// v0.3 results file (eval-harness.md §5) plus "n-shot" and "n-samples".
nlohmann::ordered_json results_json(const EvalReport& rep, const EvalOptions& opt);
// The harness's markdown table: Task | Version | Metric | Value | ± | Stderr (4 decimals).
std::string results_table(const EvalReport& rep);

// `--checkpoint DIR` or `--random-init RECIPE [--set k=v ...]` -> a tp=1 fp32 model.
model::LoadedModel load_eval_model(const std::string& checkpoint, const std::string& random_recipe,
                                   const std::vector<std::string>& overrides);
// GPT-2 vocab.json / merges.txt: the given paths, else third_party/gpt2 under the
// current directory or next to the binary's source tree.
std::shared_ptr<const data::Tokenizer> load_gpt2_tokenizer(const std::string& vocab, const std::string& merges);
// `--tokenizer tokenizer.json` (with its end-of-document token: `eod_token`, or the
// tokenizer_config.json beside it) when given, else GPT-2's files as above.
// `add_special_tokens`: whether a tokenizer.json's template (BOS) applies to each encode.
// With none of them given, a tokenizer.json in the checkpoint root (`checkpoint import`
// puts it there) is used.
std::shared_ptr<const data::TextTokenizer> load_text_tokenizer(const std::string& vocab, const std::string& merges,
                                                               const std::string& tokenizer_json,
                                                               const std::string& eod_token, bool add_special_tokens,
                                                               const std::string& checkpoint = "");
// The tokenizer.json of a checkpoint (ROOT/tokenizer.json, for ROOT or ROOT/iter_X), or "".
std::string checkpoint_tokenizer(const std::string& checkpoint);

// `eval` or `generate` (`command`) under mpirun/srun: the checkpoint's recipe with
// `overrides` (--set) applied, checked by `check` (the command's own layout rules; may be
// empty) and against the world size, then the world started under the recipe's
// collective timeout, the log's rank context set. InputError before any process group
// exists for a missing --checkpoint or a bad layout.
struct InferenceWorld {
  std::string dir;  // the resolved checkpoint directory
  Recipe recipe;
  std::shared_ptr<parallel::Communicator> world;
};
InferenceWorld start_inference_world(const char* command, const std::string& checkpoint,
                                     const std::vector<std::string>& overrides, const parallel::LaunchInfo& launch,
                                     const std::function<void(const Recipe&)>& check = {});

}  // namespace mtnlg::app
