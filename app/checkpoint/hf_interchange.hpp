// `mtnlg checkpoint export` / `import`: Hugging Face directories (config.json, the weights
// as model.safetensors or as shards listed by model.safetensors.index.json, optionally a
// tokenizer.json) to and from mtnlg checkpoints, one family of models at a time:
//   GPT-2    GPT2LMHeadModel (learned positions, LayerNorm, GELU, tied, biases)
//   Llama    LlamaForCausalLM (rotary positions, RMSNorm, SwiGLU, grouped-query attention,
//            tied or untied, biases everywhere or nowhere), Qwen2ForCausalLM (the same
//            with biases on q/k/v alone) and Qwen3ForCausalLM (no biases, per-head q/k
//            norms: qk_layernorm).
// Export picks the family from the checkpoint's recipe, import from config.json's
// `architectures` / `model_type`; what the other side cannot express is an InputError
// naming the recipe key or config.json field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mtnlg::app {

// hf: the family the checkpoint (export) or config.json (import) says; hf-gpt2: GPT-2
// only (any other family is an InputError), the name the command had first.
inline constexpr const char* kHfFormats[] = {"hf", "hf-gpt2"};

struct HfExportOptions {
  std::string format = "hf";
  DType dtype = DType::f32;                      // of the written weights: f32 or bf16
  int64_t max_shard_bytes = 5'000'000'000;       // larger exports are sharded (Hugging Face's 5GB)
  int64_t bos_token_id = -1, eos_token_id = -1;  // -1: from the checkpoint (see export_hf)
};

// Writes OUT_DIR/config.json and the weights (OUT_DIR/model.safetensors, or
// model-0000i-of-0000n.safetensors + model.safetensors.index.json when they exceed
// max_shard_bytes; stale files of those names are removed first), the real vocabulary
// rows only. bos/eos ids: the options, else the hf_config.json an import left in the
// checkpoint root, else GPT-2's 50256 for a 50257-token vocabulary, else none (null). A
// tokenizer.json (+ tokenizer_config.json) in the checkpoint root is copied along.
// Returns the files written.
std::vector<std::string> export_hf(const std::string& in, const std::string& out_dir, const HfExportOptions& opt);

// Reads a Hugging Face directory and writes a checkpoint root `out` (iteration 0, tp = pp =
// 1) whose recipe is `recipe_path` (its model section must match config.json) or, without
// one, a recipe built from config.json. A tokenizer.json in DIR (and its
// tokenizer_config.json) is checked (it must load, and fit the vocabulary) and copied into
// `out`, where eval and generate find it; config.json is kept as OUT/hf_config.json (its
// bos/eos token ids serve a later export). Returns the iteration directory.
std::string import_hf(const std::string& in_dir, const std::string& out, const std::string& recipe_path,
                      const std::string& format = "hf");

// "5GB", "500MB", "2GiB", "1000000" -> bytes (Hugging Face's units: KB/MB/GB/TB powers of
// 1000, KiB/MiB/GiB/TiB powers of 1024); InputError naming `key` otherwise.
int64_t parse_byte_size(const std::string& text, const std::string& key);

}  // namespace mtnlg::app
