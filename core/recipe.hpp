// The recipe: a YAML file parsed into typed, validated structs. Keys are Megatron's
// argument names in snake_case (docs/RECIPES.md lists every key, its default and range).
// Precedence: defaults < recipe file < --set overrides. Unknown keys, wrong types and
// out-of-range values throw InputError naming file:line:col; validate() applies the
// cross-field rules after all values are known.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace YAML {
class Node;
}

namespace mtnlg {

enum class Precision { fp32, bf16, fp16 };
enum class RecomputeGranularity { none, selective, full };
enum class LrDecayStyle { cosine, linear, constant };

std::string to_string(Precision p);
std::string to_string(RecomputeGranularity r);
std::string to_string(LrDecayStyle s);

struct ModelConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t ffn_hidden_size = 0;  // 0 -> 4 * hidden_size
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;  // 0 -> seq_length
  int64_t vocab_size = 50257;
  int64_t make_vocab_size_divisible_by = 128;
  double init_method_std = 0.02;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double layernorm_epsilon = 1e-5;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Vocabulary padded to a multiple of make_vocab_size_divisible_by * tp (Megatron).
  int64_t padded_vocab_size(int64_t tp) const;
};

struct ParallelConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0 = no interleaving
  std::vector<int64_t> pipeline_layers;               // layers per stage; empty = even split
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;
  int64_t ddp_bucket_size = 0;  // elements per gradient bucket; 0 = max(40M, 1M*dp)
  // Collective watchdog (parallel/watchdog.hpp): a host-side collective or transfer that
  // waits longer ends the job naming the rank that did not arrive; 0 = off.
  double distributed_timeout_minutes = 10;
};

struct RampupBatchSize {
  int64_t start = 0;
  int64_t increment = 0;
  int64_t ramp_tokens = 0;
};

struct TrainingConfig {
  Precision precision = Precision::fp32;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;
  std::optional<RampupBatchSize> rampup_batch_size;
  int64_t train_iters = 0;
  int64_t train_samples = 0;
  int64_t train_tokens = 0;
  int64_t seed = 1234;
  double exit_duration_mins = 0;  // 0 = none
  int64_t eval_interval = 0;      // 0 = no validation during training
  int64_t eval_iters = 10;
  int64_t num_threads = 0;  // CPU threads per process; 0 = all cores
  int64_t max_nonfinite_in_a_row = 10;
};

struct OptimizerConfig {
  double lr = 1e-4;
  double min_lr = 0.0;
  LrDecayStyle lr_decay_style = LrDecayStyle::cosine;
  int64_t lr_warmup_tokens = 0;
  int64_t lr_decay_tokens = 0;  // 0 -> the whole run
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;  // 0 = no clipping
  double initial_loss_scale = 4294967296.0;  // 2^32, fp16 only
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  double min_loss_scale = 1.0;
};

struct BlendSource {
  double weight = 1.0;
  std::string prefix;
  // false: the entry has no weight. One such source alone is Megatron's unweighted
  // `--data-path PREFIX` (its own sample order, no blend surplus); data.path sets it.
  bool weighted = true;
};

struct DataConfig {
  std::vector<BlendSource> blend;
  std::string split = "969,30,1";
  std::string vocab_file;
  std::string merge_file;
  std::string cache_dir;  // "" -> <logging.dir>/index-cache
  bool mock = false;
  bool eod_mask_loss = false;
};

struct CheckpointConfig {
  std::string save;
  std::string load;
  int64_t save_interval = 0;
  int64_t keep_last = 0;  // 0 = keep all
};

struct LoggingConfig {
  std::string dir;  // "" -> runs/<recipe name>
  int64_t log_interval = 1;
  bool tensorboard = true;
  // Peak TFLOP/s per device for MFU. 0 = the GPU's dense bf16 peak on CUDA, and on the
  // CPU the sgemm rate measured at start-up (the log names which).
  double peak_tflops = 0;
};

struct Recipe {
  std::string name;         // file stem, e.g. "mtnlg-530b"
  std::string source_path;  // where it was read from ("" for built in)
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  // What the overrides did beyond setting their key (e.g. a --set of one run length
  // replacing the recipe's other one), for `recipe show` and the run log.
  std::vector<std::string> notes;

  int64_t tp() const { return parallel.tensor_model_parallel_size; }
  int64_t pp() const { return parallel.pipeline_model_parallel_size; }
};

// Reads `path`, applies `overrides` ("section.key=value", value parsed as YAML), fills
// defaults and runs validate(). Throws InputError with file:line:col on any problem.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text (tests); `origin` stands in for the file name in messages.
Recipe parse_recipe(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

// Cross-field rules that hold for any world size (hidden % heads, batch sizes, ramp,
// layers vs stages...). Throws InputError naming the fields.
void validate(const Recipe& r);
// Rules that need the world size: world % (tp*pp) == 0, batch divisible by mbs*dp.
void validate_layout(const Recipe& r, int64_t world_size);

// The resolved recipe as YAML (every key, defaults filled in) — `recipe show` and
// recipe.resolved.yaml. Parsing the output gives back an equal recipe.
std::string to_yaml(const Recipe& r);

// "270B", "12e9", "1.5M", 2048 -> integer counts. Throws InputError(what) when the
// text is not a whole non-negative number.
int64_t parse_count(const std::string& text, const std::string& what);
// The one boolean spelling of recipes, --set values and environment switches: true/yes/on
// and false/no/off in lower, Capitalised or UPPER case; nullopt for anything else.
std::optional<bool> parse_bool(const std::string& text);

}  // namespace mtnlg
