// The model's arithmetic, from its shape alone: parameters and FLOPs per iteration, the one
// definition the trainer's log line (TFLOP/s, MFU), the planner and the benchmarks' notes
// use (formulas and their sources: docs/PLANNER.md "FLOPs").
//
// Two forms, one count. The GPT family (learned positions, GELU MLP of 4h, one key/value
// head per query head, head size h / heads) keeps Megatron's 72-form exactly as published.
// Any other shape (the Llama family: SwiGLU, grouped-query attention, kv_channels, another
// ffn width; mixture-of-experts layers) is counted by Megatron-Core's
// num_floating_point_operations with its GQA, gated-MLP and MoE terms; on a GPT shape the
// two are the same number, and the GPT keeps its published form to the last bit.
#pragma once
#include <cstdint>
#include <string>

#include "config/model.hpp"
#include "config/parallel.hpp"

namespace mtnlg::model {

// Whether the model has the GPT shape the 72-form counts (above).
bool gpt_flops_form(const ModelConfig& m);

// Parameters. GPT form: Narayanan et al. 2021, eq. 2, with the padded vocabulary `vocab`.
// Otherwise the exact count of the parameters the model declares (model/gpt.cpp
// declare_chunk_params): every layer's q/k/v (H + 2G) D x h, projection H D x h, gate
// and up (SwiGLU) or fc1, fc2, the biases and norm weights the recipe has, the word
// embedding, the learned position table (learned_absolute only), the final norm and the
// untied output layer.
// MoE layers: the router [E, h] (and its expert bias [E]), every expert's fc1 and fc2, the
// shared expert (and its gate [1, h]).
double parameter_count(const ModelConfig& m, int64_t vocab);
// The parameters one token goes through: parameter_count with each MoE layer's E experts
// replaced by the top-k it is routed to (the router and the shared expert whole); equal to
// parameter_count for a dense model.
double active_parameter_count(const ModelConfig& m, int64_t vocab);
// Model FLOPs of one iteration of `global_batch` sequences (attention counted dense), what
// MFU divides. GPT form: Megatron's 72 B l s h^2 (1 + s/(6h) + V/(12 l h)). Otherwise
// Megatron-Core's 12 B s l h^2 ((1 + G/H + s/h) H D / h + (F/h) g + V/(2 l h)), g = 3/2
// under SwiGLU (three ffn matrices instead of two), 1 otherwise; with MoE layers F/h is
// (F (l - l_moe) + (F_moe k + F_shared) l_moe) / (l h): the dense layers' MLP and, on the
// MoE layers, the k experts a token is routed to and the shared expert (the router's
// h x E GEMM is not counted, as Megatron-Core does not).
double model_flops(const ModelConfig& m, int64_t vocab, int64_t global_batch);
// Hardware FLOPs: the model FLOPs plus what recompute runs again (full: the layers'
// forward once more, the 96-form for the GPT; selective: the attention core's term once
// more); what the HFU and "TFLOP/s" of Megatron count.
double hardware_flops(const ModelConfig& m, int64_t vocab, int64_t global_batch, RecomputeGranularity rc);
// The model_flops formula as the train banner prints it.
std::string model_flops_formula(const ModelConfig& m);

}  // namespace mtnlg::model
