// Offline checkpoint tools behind `mtnlg checkpoint`: convert to another (tp, pp)
// layout, export to / import from Hugging Face's GPT-2 layout, and write a one-shard
// checkpoint from a whole model.
#pragma once
#include <string>

#include "config/recipe.hpp"
#include "model/params.hpp"

namespace mtnlg::app {

// Reads any-layout checkpoint `in` (root or iteration dir) and writes it to root `out`
// with tensor parallel `tp` and pipeline parallel `pp` (dp = 1, no ZeRO-1), weights and
// optimizer state, same iteration and training state. Returns the output iteration dir.
std::string convert_checkpoint(const std::string& in, const std::string& out, int64_t tp, int64_t pp);

// Writes DIR/config.json and DIR/model.safetensors in Hugging Face's GPT-2 layout
// (GPT2LMHeadModel: names h.{i}.attn.c_attn.weight..., Conv1D weights stored [in, out],
// the 50257 real vocabulary rows only).
void export_hf_gpt2(const std::string& in, const std::string& out_dir);

// Reads DIR/config.json + DIR/model.safetensors (Hugging Face GPT-2) and writes a
// checkpoint root `out` (iteration 0, tp = pp = 1) whose recipe is `recipe_path` (its
// model section must match config.json) or, without one, a recipe built from config.json.
// A tokenizer.json in DIR (and its tokenizer_config.json) is checked (it must load, and
// fit the vocabulary) and copied into `out`, where eval and generate find it.
std::string import_hf_gpt2(const std::string& in_dir, const std::string& out, const std::string& recipe_path);

// A complete one-shard checkpoint (tp = pp = dp = 1, no optimizer state) of `store`,
// which holds the whole model as declare_chunk_params(..., {0, L, true, true}, 0, 1) lays it out.
std::string save_whole_model(const std::string& root, const Recipe& r, const model::ParamStore& store, int64_t iteration);

}  // namespace mtnlg::app
