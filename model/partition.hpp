// Which layers each pipeline rank runs: the one place that splits the model into
// pipeline chunks, for the trainer, eval and the checkpoint tools alike.
//
// Without interleaving a rank holds one chunk: num_layers / pp consecutive layers, or
// the recipe's explicit `parallel.pipeline_layers` list. With interleaving
// (num_layers_per_virtual_pipeline_stage = k) there are v = num_layers / (pp * k)
// chunks per rank and chunk c of pp rank r is virtual stage c * pp + r (Megatron's
// order), holding layers [(c * pp + r) * k, + k). The first virtual stage holds the
// embedding, the last the final norm and the (tied) output layer.
#pragma once
#include <cstdint>
#include <vector>

#include "config/recipe.hpp"
#include "model/gpt.hpp"

namespace mtnlg::model {

// Model chunks per pipeline rank (1 without interleaving).
int64_t virtual_chunks(const Recipe& r);
// The chunks of pipeline rank `pp_rank`, in chunk order.
std::vector<ChunkSpec> partition_chunks(const Recipe& r, int64_t pp_rank);

}  // namespace mtnlg::model
