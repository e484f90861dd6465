#include "model/partition.hpp"

namespace mtnlg::model {

int64_t virtual_chunks(const PipelineSplit& p) {
  const int64_t k = p.num_layers_per_virtual_pipeline_stage;
  if (k <= 0) return 1;
  return p.num_layers / p.pipeline_model_parallel_size / k;
}

std::vector<ChunkSpec> partition_chunks(const PipelineSplit& p, int64_t pp_rank) {
  const int64_t pp = p.pipeline_model_parallel_size, v = virtual_chunks(p);
  MTNLG_CHECK(pp_rank >= 0 && pp_rank < pp, "pipeline rank {} outside [0, {})", pp_rank, pp);
  std::vector<ChunkSpec> chunks;
  for (int64_t c = 0; c < v; ++c) {
    ChunkSpec s;
    const auto& explicit_layers = p.pipeline_layers;
    if (!explicit_layers.empty()) {
      for (int64_t st = 0; st < pp_rank; ++st) s.first_layer += explicit_layers[static_cast<size_t>(st)];
      s.num_layers = explicit_layers[static_cast<size_t>(pp_rank)];
    } else {
      const int64_t per = p.num_layers / (pp * v);
      s.first_layer = (c * pp + pp_rank) * per;
      s.num_layers = per;
    }
    s.has_embedding = pp_rank == 0 && c == 0;
    s.has_head = pp_rank == pp - 1 && c == v - 1;
    chunks.push_back(s);
  }
  return chunks;
}

}  // namespace mtnlg::model
