#include "app/process/module_configs.hpp"

#include "core/error.hpp"

#include "model/checkpoint.hpp"

namespace mtnlg::app {

optimizer::AdamWConfig adamw_config(const OptimizerConfig& o) {
  optimizer::AdamWConfig c;
  c.beta1 = o.adam_beta1;
  c.beta2 = o.adam_beta2;
  c.eps = o.adam_eps;
  c.weight_decay = o.weight_decay;
  c.clip_grad = o.clip_grad;
  return c;
}

optimizer::LossScalerConfig loss_scaler_config(const OptimizerConfig& o) {
  optimizer::LossScalerConfig c;
  c.initial_scale = o.initial_loss_scale;
  c.window = o.loss_scale_window;
  c.hysteresis = o.hysteresis;
  c.min_scale = o.min_loss_scale;
  return c;
}

namespace {
// The architecture family's parts, from the model section's keys.
void set_architecture(model::GptConfig& c, const ModelConfig& m) {
  c.groups = m.query_groups();
  c.head_size = m.head_dim();
  c.rope = m.rope();
  c.rope_params.base = m.rotary_base;
  c.rope_params.percent = m.rotary_percent;
  c.rope_params.interleaved = m.rotary_interleaved;
  c.rope_params.scaling = m.use_rope_scaling;
  c.rope_params.factor = m.rope_scaling_factor;
  c.rmsnorm = m.rmsnorm();
  c.swiglu = m.swiglu;
  c.untied = m.untie_embeddings_and_output_weights;
  c.bias_linear = m.add_bias_linear;
  c.qkv_bias = m.qkv_bias();
  c.qk_norm = m.qk_layernorm;
}
// The MoE keys as the model takes them (the combinations refuse_unwired_moe refuses never
// get here from `train`).
void set_moe(model::GptConfig& c, const ModelConfig& m) {
  const MoeConfig& e = m.moe;
  if (!e.enabled()) return;
  model::MoeLayerConfig& o = c.moe;
  o.num_experts = e.num_experts;
  o.ffn = e.moe_ffn_hidden_size > 0 ? e.moe_ffn_hidden_size : m.ffn_hidden_size;
  o.shared_ffn = e.moe_shared_expert_intermediate_size;
  o.shared_gate = e.moe_shared_expert_gate;
  o.router.topk = e.moe_router_topk;
  o.router.score =
      e.moe_router_score_function == MoeScoreFunction::sigmoid ? ops::RouterScore::sigmoid : ops::RouterScore::softmax;
  o.router.pre_softmax = e.moe_router_pre_softmax;
  o.router.scaling_factor = e.moe_router_topk_scaling_factor;
  o.router.num_groups = e.moe_router_num_groups;
  o.router.group_topk = e.moe_router_group_topk;
  o.router_fp64 = e.moe_router_dtype == MoeRouterDtype::fp64;
  o.balancing = e.moe_router_load_balancing_type == MoeLoadBalancing::seq_aux_loss ? model::MoeBalancing::seq_aux_loss
                : e.moe_router_load_balancing_type == MoeLoadBalancing::none       ? model::MoeBalancing::none
                : e.moe_router_load_balancing_type == MoeLoadBalancing::global_aux_loss
                    ? model::MoeBalancing::global_aux_loss
                : e.moe_router_load_balancing_type == MoeLoadBalancing::sinkhorn ? model::MoeBalancing::sinkhorn
                                                                                 : model::MoeBalancing::aux_loss;
  if (o.balancing == model::MoeBalancing::sinkhorn) {  // its weights (Megatron-Core's): softmax over all, or sigmoid
    o.router.score = e.moe_router_topk == 1 ? ops::RouterScore::sigmoid : ops::RouterScore::softmax;
    o.router.pre_softmax = e.moe_router_topk > 1;
  }
  o.aux_coeff = e.moe_aux_loss_coeff;
  o.z_coeff = e.moe_z_loss_coeff;
  o.expert_bias = e.moe_router_enable_expert_bias;
  o.bias_update_rate = e.moe_router_bias_update_rate;
  o.capacity_factor = e.moe_expert_capacity_factor.value_or(0.0);
  o.jitter_eps = e.moe_input_jitter_eps;
  o.pad_to_capacity = e.moe_pad_expert_input_to_capacity;
  o.drop_policy =
      e.moe_token_drop_policy == MoeDropPolicy::position ? ops::DropPolicy::position : ops::DropPolicy::probs;
  for (int64_t i = 0; i < m.num_layers; ++i) o.layers.push_back(e.is_moe_layer(i) ? 1 : 0);
}
}  // namespace

namespace {
model::GptConfig build_gpt_config(const Recipe& r);
}  // namespace

model::GptConfig gpt_config(const Recipe& r, bool moe) {
  if (moe)
    refuse_unwired_moe(r);
  else
    refuse_moe_model(r, "mtnlg");
  return build_gpt_config(r);
}

model::GptConfig parallel_inference_config(const Recipe& r) {
  model::GptConfig c = build_gpt_config(r);
  c.hidden_dropout = c.attention_dropout = 0;
  c.recompute = RecomputeGranularity::none;
  c.sequence_parallel = false;
  c.moe.capacity_factor = 0;
  c.moe.pad_to_capacity = false;
  return c;
}

model::GptConfig inference_config(const Recipe& r) {
  Recipe one = r;
  one.parallel.tensor_model_parallel_size = 1;  // one rank's padded vocabulary, no sequence parallelism
  one.parallel.sequence_parallel = false;
  model::GptConfig c = build_gpt_config(one);
  c.hidden_dropout = c.attention_dropout = 0;
  c.recompute = RecomputeGranularity::none;
  c.dtype = DType::f32;
  c.moe.capacity_factor = 0;  // every token to its k experts: no drops, no padding
  c.moe.pad_to_capacity = false;
  return c;
}

namespace {
model::GptConfig build_gpt_config(const Recipe& r) {
  model::GptConfig c;
  c.vocab_size = r.model.vocab_size;
  c.padded_vocab_size = r.model.padded_vocab_size(r.tp());
  c.hidden = r.model.hidden_size;
  c.heads = r.model.num_attention_heads;
  c.ffn = r.model.ffn_hidden_size;
  c.seq_length = r.model.seq_length;
  c.max_positions = r.model.max_position_embeddings;
  c.num_layers_total = r.model.num_layers;
  c.init_std = r.model.init_method_std;
  c.hidden_dropout = r.model.hidden_dropout;
  c.attention_dropout = r.model.attention_dropout;
  c.layernorm_eps = r.model.layernorm_epsilon;
  set_architecture(c, r.model);
  set_moe(c, r.model);
  c.recompute = r.parallel.recompute_granularity;
  c.attention = r.model.attention_backend;
  c.micro_batch_size = r.training.micro_batch_size;
  c.sequence_parallel = r.parallel.sequence_parallel && r.tp() > 1;
  c.cp_comm = r.parallel.cp_comm_type;
  const auto& hier = r.parallel.hierarchical_context_parallel_sizes;
  c.cp_a2a_size = hier.empty() ? 0 : hier[0];
  c.seed = static_cast<uint64_t>(r.training.seed);
  c.dtype = model::compute_dtype(r.training.precision);
  return c;
}
}  // namespace

model::PipelineSplit pipeline_split(const Recipe& r) {
  model::PipelineSplit s;
  s.num_layers = r.model.num_layers;
  s.pipeline_model_parallel_size = r.pp();
  s.num_layers_per_virtual_pipeline_stage = r.parallel.num_layers_per_virtual_pipeline_stage;
  s.pipeline_layers = r.parallel.pipeline_layers;
  return s;
}

data::BlendSpec blend_spec(const Recipe& r) {
  data::BlendSpec s;
  s.blend = r.data.blend;
  s.split = r.data.split;
  s.seq_length = r.model.seq_length;
  s.vocab_size = r.model.vocab_size;
  s.seed = r.training.seed;
  return s;
}

model::LoadedModel load_for_inference(const std::string& path) {
  const std::string dir = model::ckpt::resolve(path);
  const model::ckpt::TrainState st = model::ckpt::read_metadata(dir);
  const Recipe r = parse_recipe(st.recipe_yaml, dir + "/metadata.json");
  return model::ckpt::load_whole_model(dir, inference_config(r));
}

}  // namespace mtnlg::app
