// The recipe turned into each module's own config, once, here: the model's GptConfig,
// its PipelineSplit and the data's BlendSpec. model/ and data/ take these and never see
// the Recipe; the trainer, eval, the checkpoint tools and the data commands call these.
// Also the one reader of a checkpoint's stored recipe (load_for_inference).
#pragma once
#include <string>

#include "config/recipe.hpp"
#include "data/sample_source.hpp"
#include "model/gpt.hpp"
#include "model/inference.hpp"
#include "model/partition.hpp"
#include "optimizer/config.hpp"

namespace mtnlg::app {

// The model as recipe `r` trains it at its tensor-parallel size: the padded vocabulary of
// r.tp(), sequence parallelism only when tp > 1, the training precision's compute dtype.
// An MoE recipe is refused (exit 2) unless `moe` (training, which builds MoE layers), and
// then only in the forms the model runs (refuse_unwired_moe).
model::GptConfig gpt_config(const Recipe& r, bool moe = false);
// The model one process runs for inference from a (checkpoint's) recipe: the whole model at
// tp = 1 in fp32, without dropout, recompute or sequence parallelism; MoE layers (built
// here too) route every token to its k experts, without a capacity's drops or padding.
// The model as eval and generate split it over tp x pp ranks under mpirun/srun: the
// recipe's, without dropout, recompute or sequence parallelism; MoE layers route every
// token to its k experts (no capacity) on every tp rank alike.
model::GptConfig parallel_inference_config(const Recipe& r);
model::GptConfig inference_config(const Recipe& r);

// The layers over r's pipeline: model.num_layers, pipeline_model_parallel_size,
// num_layers_per_virtual_pipeline_stage and the explicit parallel.pipeline_layers.
model::PipelineSplit pipeline_split(const Recipe& r);

// The optimizer's settings from the recipe's optimizer section: AdamW's betas, eps, weight
// decay and clipping; the fp16 loss scaler's initial scale, window, hysteresis and floor.
optimizer::AdamWConfig adamw_config(const OptimizerConfig& o);
optimizer::LossScalerConfig loss_scaler_config(const OptimizerConfig& o);

// The blend source's inputs: data.blend and data.split, model.seq_length and
// model.vocab_size, training.seed.
data::BlendSpec blend_spec(const Recipe& r);

// The whole model (tp = 1, pp = 1, fp32) from a checkpoint root or iteration directory:
// the inference_config of its stored recipe (metadata.json), its weights loaded by
// model::ckpt::load_whole_model.
model::LoadedModel load_for_inference(const std::string& path);

}  // namespace mtnlg::app
