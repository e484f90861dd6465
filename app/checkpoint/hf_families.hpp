// The pieces hf_interchange.cpp dispatches to: one mapping per family of Hugging Face
// models (hf_gpt2.cpp, hf_llama.cpp), and what they share: config.json's fields, the
// weights of a directory (one file or shards), the tensors of an export.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/recipe.hpp"
#include "core/safetensors.hpp"
#include "model/inference.hpp"
#include "model/params.hpp"

namespace mtnlg::app::hf {

// A directory's config.json; its readers throw InputError naming the file and field.
struct Config {
  std::string path;  // DIR/config.json
  nlohmann::json j;

  bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t integer(const std::string& key) const;  // required
  int64_t integer(const std::string& key, int64_t fallback) const;
  double number(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  [[noreturn]] void bad(const std::string& key, const std::string& why) const;
};
Config read_config(const std::string& dir);

// The weights of a Hugging Face directory: model.safetensors, or the shards that
// model.safetensors.index.json's weight_map names (one shard in memory at a time).
class Weights {
 public:
  explicit Weights(const std::string& dir);  // InputError when neither file is there
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  // The first tensor (by name) that no get() asked for; "" when every one was read.
  std::string first_unread() const;
  std::string index_or_single() const;  // the file that lists the tensors (for errors)
  // The tensor as f32 (from F32, BF16 or F16); InputError naming the file and tensor when
  // it is missing, of another shape or of another dtype.
  Tensor get(const std::string& name, const Shape& shape);

 private:
  std::string dir_;
  std::map<std::string, std::string> where_;  // tensor -> file
  std::set<std::string> read_;                // the tensors get() returned
  std::string open_;                          // the file in memory
  safetensors::File file_;
};

// One tensor of an export, made (f32, host) when its shard is written.
struct OutTensor {
  std::string name;
  Shape shape;
  std::function<Tensor()> make;
};

// What a family's export gives: config.json (without the token ids and torch_dtype, which
// the caller adds) and the tensors in order.
struct Export {
  nlohmann::ordered_json config;
  std::vector<OutTensor> tensors;
};

// The checkpoint's rows 0..V-1 of a [padded, C] parameter.
Tensor real_rows(const model::LoadedModel& m, const std::string& name, int64_t V);
// A copy of a parameter.
Tensor param_copy(const model::LoadedModel& m, const std::string& name);
// [a, b] -> [b, a].
Tensor transpose(const Tensor& w);

// ---- GPT-2 (hf_gpt2.cpp) -------------------------------------------------------------
// Why GPT2LMHeadModel cannot express model `m`, naming the recipe key; "" when it can.
std::string gpt2_unfit(const ModelConfig& m);
Export gpt2_export(const model::LoadedModel& m);
Recipe gpt2_recipe(const Config& cfg, const std::string& recipe_path);
void gpt2_weights(Weights& w, const Recipe& r, model::ParamStore& store);

// ---- Llama, Qwen2, Qwen3 (hf_llama.cpp) -----------------------------------------------
// The class of a Llama-family config.json: LlamaForCausalLM, Qwen2ForCausalLM (q/k/v
// biases alone), Qwen3ForCausalLM (per-head q/k norms).
enum class LlamaKind { llama, qwen2, qwen3 };
std::string llama_unfit(const ModelConfig& m);  // as gpt2_unfit
// config.json's rope_scaling of `mc` (null, or Llama 3.1's llama3 object).
nlohmann::ordered_json llama_rope_scaling(const ModelConfig& mc);
// An MoE layer's MLP tensors, which the MoE families (hf_moe.cpp) put in the layer loop of
// llama_export / llama_weights in place of the dense MLP's: out for layer `l` (export),
// read for layer `l` (import).
using MoeLayerOut = std::function<void(int64_t l, std::vector<OutTensor>& out)>;
using MoeLayerIn = std::function<void(int64_t l)>;
Export llama_export(const ModelConfig& mc, const model::LoadedModel& m, const MoeLayerOut& moe = {});
// What an MoE family adds to llama_recipe's model section: its keys (", key: value, ..."
// in YAML's flow form) and, for Qwen3-MoE, a head_dim defaulting to hidden_size / heads.
struct LlamaRecipeExtra {
  std::string model_yaml;
  bool head_dim_from_hidden = false;
};
Recipe llama_recipe(const Config& cfg, LlamaKind kind, const std::string& recipe_path,
                    const LlamaRecipeExtra& extra = {});
void llama_weights(Weights& w, const Recipe& r, model::ParamStore& store, const MoeLayerIn& moe = {});

// ---- Mixtral, Qwen2-MoE, Qwen3-MoE (hf_moe.cpp) ----------------------------------------
// MixtralForCausalLM (every layer MoE, renormalised top-k, no biases), Qwen2MoeForCausalLM
// (a sigmoid-gated shared expert, q/k/v biases, dense layers by decoder_sparse_step /
// mlp_only_layers) and Qwen3MoeForCausalLM (per-head q/k norms, no shared expert).
enum class MoeKind { mixtral, qwen2_moe, qwen3_moe };
// Why none of the three classes can express MoE model `m`, naming the recipe key; "" when
// one can (the one moe_export writes).
std::string moe_unfit(const ModelConfig& m);
Export moe_export(const ModelConfig& mc, const model::LoadedModel& m);
Recipe moe_recipe(const Config& cfg, MoeKind kind, const std::string& recipe_path);
// The weights (transformers 4's per-expert tensors or transformers 5's fused per-layer
// ones); a tensor of the directory that the model does not use is an InputError naming it.
void moe_weights(Weights& w, const Recipe& r, MoeKind kind, model::ParamStore& store);

}  // namespace mtnlg::app::hf
