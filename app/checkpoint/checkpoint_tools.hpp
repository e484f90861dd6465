// Offline checkpoint tools behind `mtnlg checkpoint`: convert to another (tp, pp) layout
// and write a one-shard checkpoint from a whole model (Hugging Face export and import:
// hf_interchange.hpp).
#pragma once
#include <string>

#include "config/recipe.hpp"
#include "model/params.hpp"

namespace mtnlg::app {

// Reads any-layout checkpoint `in` (root or iteration dir) and writes it to root `out`
// with tensor parallel `tp` and pipeline parallel `pp` (dp = 1, no ZeRO-1), weights and
// optimizer state, same iteration and training state. Returns the output iteration dir.
std::string convert_checkpoint(const std::string& in, const std::string& out, int64_t tp, int64_t pp);

// A complete one-shard checkpoint (tp = pp = dp = 1, no optimizer state) of `store`,
// which holds the whole model as declare_chunk_params(..., {0, L, true, true}, 0, 1) lays it out.
std::string save_whole_model(const std::string& root, const Recipe& r, const model::ParamStore& store,
                             int64_t iteration);

}  // namespace mtnlg::app
