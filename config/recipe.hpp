// The recipe: a YAML file parsed into typed, validated structs, one per subsystem
// (config/model.hpp, parallel.hpp, training.hpp, data.hpp, output.hpp), which the
// subsystems include on their own. Keys are Megatron's argument names in snake_case
// (docs/RECIPES.md lists every key, its default and range). Precedence: defaults <
// recipe file < --set overrides. Unknown keys, wrong types and out-of-range values throw
// InputError naming file:line:col; validate() applies the cross-field rules after all
// values are known.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/data.hpp"
#include "config/model.hpp"
#include "config/output.hpp"
#include "config/parallel.hpp"
#include "config/training.hpp"
#include "core/parse.hpp"

namespace YAML {
class Node;
}

namespace mtnlg {

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
  int64_t cp() const { return parallel.context_parallel_size; }
  int64_t ep() const { return parallel.expert_model_parallel_size; }
  // The expert tensor-parallel size: expert_tensor_parallel_size, or tp when it is 0.
  int64_t etp() const { return parallel.expert_tensor_parallel_size > 0 ? parallel.expert_tensor_parallel_size : tp(); }
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
// Rules that need the world size: world % (tp*cp*pp) == 0, batch divisible by mbs*dp
// (dp = world / (tp*cp*pp)); with experts, world % (etp*ep*pp) == 0.
void validate_layout(const Recipe& r, int64_t world_size);
// Paths that build the model without MoE layers (the checkpoint tools, Hugging Face
// export) call this: a recipe with model.num_experts > 0 is
// refused (InputError, exit 2) rather than silently built as a dense one. `command` names
// the caller.
void refuse_moe_model(const Recipe& r, const std::string& command);
// What `mtnlg train` cannot do with MoE layers yet (InputError, exit 2, one line naming the
// key): tensor parallelism without sequence parallelism (each tp rank routes its own
// rows), the per-sequence loss under tp, a CUDA or test device, bf16/fp16, the global
// balancing loss, input jitter, the fp64 router and linear biases. Expert, expert-tensor,
// tensor (with sp), pipeline and data parallelism train.
void refuse_unwired_moe(const Recipe& r);

// The resolved recipe as YAML (every key, defaults filled in) — `recipe show` and
// recipe.resolved.yaml. Parsing the output gives back an equal recipe.
std::string to_yaml(const Recipe& r);

}  // namespace mtnlg
