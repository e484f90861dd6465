// Which layers each pipeline rank runs: the one place that splits the model into
// pipeline chunks, for the trainer, eval and the checkpoint tools alike.
//
// Without interleaving a rank holds one chunk: num_layers / pp consecutive layers, or
// an explicit list of layers per stage (the recipe's `parallel.pipeline_layers`). With interleaving
// (num_layers_per_virtual_pipeline_stage = k) there are v = num_layers / (pp * k)
// chunks per rank and chunk c of pp rank r is virtual stage c * pp + r (Megatron's
// order), holding layers [(c * pp + r) * k, + k). The first virtual stage holds the
// embedding, the last the final norm and the (tied) output layer.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt.hpp"

namespace mtnlg::model {

// How the layers are split over the pipeline (Megatron's argument names; the app makes
// it from a recipe: app::pipeline_split in app/process/module_configs.hpp).
struct PipelineSplit {
  int64_t num_layers = 0;
  int64_t pipeline_model_parallel_size = 1;
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0 = no interleaving
  std::vector<int64_t> pipeline_layers;               // layers per stage; empty = even split
};

// Model chunks per pipeline rank (1 without interleaving).
int64_t virtual_chunks(const PipelineSplit& s);
// The chunks of pipeline rank `pp_rank`, in chunk order.
std::vector<ChunkSpec> partition_chunks(const PipelineSplit& s, int64_t pp_rank);

}  // namespace mtnlg::model
