// The model's arithmetic, from its shape alone: parameters and FLOPs per iteration, the one
// definition the trainer's log line (TFLOP/s, MFU), the planner and the benchmarks' notes
// use (formulas and their sources: docs/PLANNER.md "FLOPs").
#pragma once
#include <cstdint>

#include "config/model.hpp"
#include "config/parallel.hpp"

namespace mtnlg::model {

// Parameters (Narayanan et al. 2021, eq. 2, with the padded vocabulary `vocab`).
double parameter_count(const ModelConfig& m, int64_t vocab);
// Model FLOPs of one iteration of `global_batch` sequences: Megatron's 72-form,
// 72 B l s h^2 (1 + s/(6h) + V/(12 l h)) (attention counted dense), what MFU divides.
double model_flops(const ModelConfig& m, int64_t vocab, int64_t global_batch);
// Hardware FLOPs: the model FLOPs plus what recompute runs again (full: the 96-form;
// selective: the attention core once more); what the HFU and "TFLOP/s" of Megatron count.
double hardware_flops(const ModelConfig& m, int64_t vocab, int64_t global_batch, RecomputeGranularity rc);

}  // namespace mtnlg::model
