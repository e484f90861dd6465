// model/flops.hpp: the FLOP forms against a published run. MT-NLG 530B (105 layers, hidden
// 20480, seq 2048, vocabulary 51200 after padding for tp 8) at global batch 1920 ran 60.1 s
// per iteration on 2240 A100s at a reported 126 TFLOP/s per GPU, counted in the 96-form of
// full recompute (Narayanan et al. 2021 / Smith et al. 2022).
#include <catch2/catch.hpp>

#include <cmath>

#include "model/flops.hpp"

using namespace mtnlg;

namespace {
// A Llama-family shape: rotary positions, RMSNorm, SwiGLU, an untied output layer, no
// linear biases.
ModelConfig llama_shape(int64_t layers, int64_t hidden, int64_t heads, int64_t groups, int64_t ffn, int64_t seq) {
  ModelConfig m;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.num_query_groups = groups;
  m.ffn_hidden_size = ffn;
  m.seq_length = seq;
  m.swiglu = true;
  m.position_embedding_type = PositionEmbedding::rope;
  m.normalization = Normalization::RMSNorm;
  m.untie_embeddings_and_output_weights = true;
  m.add_bias_linear = false;
  return m;
}
}  // namespace

TEST_CASE("model FLOPs: the forms reproduce MT-NLG 530B's published 126 TFLOP/s from 60.1 s", "[flops]") {
  ModelConfig m;
  m.num_layers = 105;
  m.hidden_size = 20480;
  m.num_attention_heads = 128;
  m.seq_length = 2048;
  const int64_t V = 51200;
  const auto within = [](double got, double want, double rel) {
    return std::fabs(got - want) <= rel * std::fabs(want);
  };
  CHECK(within(model::hardware_flops(m, V, 1920, RecomputeGranularity::full) / (2240 * 60.1) / 1e12, 126, 0.005));
  CHECK(within(model::parameter_count(m, V) / 1e9, 530, 0.01));
  // 96-form / 72-form = 4/3 up to the attention and logit terms.
  const double ratio = model::hardware_flops(m, V, 1920, RecomputeGranularity::full) / model::model_flops(m, V, 1920);
  CHECK(ratio > 1.33);
  CHECK(ratio < 1.34);
  // selective recompute runs the attention core once more: between the two
  const double sel = model::hardware_flops(m, V, 1920, RecomputeGranularity::selective);
  CHECK(sel > model::model_flops(m, V, 1920));
  CHECK(sel < model::hardware_flops(m, V, 1920, RecomputeGranularity::full));
  CHECK(model::hardware_flops(m, V, 1920, RecomputeGranularity::none) == model::model_flops(m, V, 1920));
}

// Llama 3 8B (32 layers, hidden 4096, 32 heads in 8 key/value groups of head size 128,
// SwiGLU ffn 14336, vocabulary 128256, untied, no biases, RMSNorm, seq 8192), counted by hand
// GEMM by GEMM for one sequence (2 FLOPs per multiply-add, forward + 2 backward GEMMs):
//   per layer  2 s (h (H + 2G) D + H D h + 3 h F) + 2 * 2 s^2 H D  (q/k/v, projection, gate +
//              up + down, Q K^T and P V dense) = 4,941,130,006,528
//   logits     2 s h V = 8,607,655,116,800
//   model      3 (32 layers + logits) = 474,422,087,516,160
//   full recompute: the layers' forward again, 4 x layers + 3 x logits = 623,955,668,893,696
//   selective: the attention core's 3 x 4 s^2 H D per layer again = 579,975,203,782,656
// Parameters 8,030,261,248 (Hugging Face's count of Meta-Llama-3-8B).
TEST_CASE("model FLOPs: Llama 3 8B by Megatron-Core's formula with GQA and SwiGLU", "[flops]") {
  const ModelConfig m = llama_shape(32, 4096, 32, 8, 14336, 8192);
  const int64_t V = 128256;
  CHECK_FALSE(model::gpt_flops_form(m));
  const auto near = [](double got, double want) { return std::fabs(got - want) <= 1e-12 * want; };
  CHECK(model::parameter_count(m, V) == 8030261248.0);
  CHECK(near(model::model_flops(m, V, 1), 474422087516160.0));
  CHECK(near(model::model_flops(m, V, 512), 512 * 474422087516160.0));
  CHECK(near(model::hardware_flops(m, V, 1, RecomputeGranularity::full), 623955668893696.0));
  CHECK(near(model::hardware_flops(m, V, 1, RecomputeGranularity::selective), 579975203782656.0));
  CHECK(model::hardware_flops(m, V, 1, RecomputeGranularity::none) == model::model_flops(m, V, 1));
  // tying the output layer changes the parameters (one V x h fewer), not the FLOPs
  ModelConfig tied = m;
  tied.untie_embeddings_and_output_weights = false;
  CHECK(model::parameter_count(tied, V) == 8030261248.0 - double(V) * 4096);
  // Qwen3's per-head q/k norms: two weights of the head size per layer
  ModelConfig qk = m;
  qk.qk_layernorm = true;
  CHECK(model::parameter_count(qk, V) == 8030261248.0 + 32 * 2 * 128);
  CHECK(model::model_flops(tied, V, 1) == model::model_flops(m, V, 1));
  CHECK(model::model_flops_formula(m) ==
        "12*B*s*l*h^2*((1+G/H+s/h)*H*D/h+3/2*F/h+V/(2*l*h)) with H 32, G 8, D 128, F 14336");
}

TEST_CASE("model FLOPs: a GPT shape keeps the 72-form to the bit, and equals Megatron-Core's count", "[flops]") {
  ModelConfig m;
  m.num_layers = 24;
  m.hidden_size = 2048;
  m.num_attention_heads = 16;
  m.seq_length = 2048;
  const int64_t V = 50304;
  REQUIRE(model::gpt_flops_form(m));
  const double l = 24, h = 2048, s = 2048, B = 8;
  CHECK(model::model_flops(m, V, 8) == 72 * B * l * s * h * h * (1 + s / (6 * h) + double(V) / (12 * h * l)));
  CHECK(model::parameter_count(m, V) == 12 * l * h * h * (1 + 13 / (12 * h) + (double(V) + s) / (12 * l * h)));
  CHECK(model::model_flops_formula(m) == "72*B*s*l*h^2*(1+s/(6h)+V/(12*l*h))");
  // Grouped-query attention takes it off the GPT form (fewer k/v FLOPs); one group per
  // head is the GPT shape again.
  ModelConfig g = m;
  g.num_query_groups = 8;  // GQA: fewer k/v FLOPs than the GPT
  CHECK_FALSE(model::gpt_flops_form(g));
  CHECK(model::model_flops(g, V, 8) < model::model_flops(m, V, 8));
  g.num_query_groups = 16;  // = heads: the GPT shape again
  CHECK(model::gpt_flops_form(g));
}

// Mixture of experts: the published totals and active counts of Mixtral 8x7B (46.7B total,
// 12.9B active) and Qwen3-30B-A3B (30.5B, 3.3B), counted exactly, and the MLP term of
// Megatron-Core's num_floating_point_operations (the k experts a token is routed to and
// the shared expert on the MoE layers, the dense MLP on the others).
TEST_CASE("model FLOPs: mixture of experts, active and total parameters and Megatron-Core's MoE terms", "[flops]") {
  ModelConfig m = llama_shape(32, 4096, 32, 8, 14336, 4096);  // Mixtral 8x7B
  m.moe.num_experts = 8;
  m.moe.moe_router_topk = 2;
  const int64_t V = 32000;
  CHECK_FALSE(model::gpt_flops_form(m));
  CHECK(model::parameter_count(m, V) == 46702792704.0);
  CHECK(model::active_parameter_count(m, V) == 12879925248.0);
  // The FLOPs are a dense model's whose MLP is k = 2 experts wide.
  ModelConfig dense = m;
  dense.moe = {};
  dense.ffn_hidden_size = 2 * 14336;
  const auto near = [](double got, double want) { return std::fabs(got - want) <= 1e-12 * want; };
  CHECK(near(model::model_flops(m, V, 8), model::model_flops(dense, V, 8)));
  CHECK(near(model::hardware_flops(m, V, 8, RecomputeGranularity::full),
             model::hardware_flops(dense, V, 8, RecomputeGranularity::full)));
  CHECK(model::model_flops_formula(m).find("l_moe 32, F_moe 14336, k 2, F_shared 0") != std::string::npos);

  ModelConfig q = llama_shape(48, 2048, 32, 4, 6144, 4096);  // Qwen3-30B-A3B: 128 experts of 768, top 8, q/k norms
  q.kv_channels = 128;
  q.qk_layernorm = true;
  q.moe.num_experts = 128;
  q.moe.moe_router_topk = 8;
  q.moe.moe_ffn_hidden_size = 768;
  CHECK(model::parameter_count(q, 151936) == 30532122624.0);
  CHECK(model::active_parameter_count(q, 151936) == 3353032704.0);

  // Every other layer MoE (moe_layer_freq 2), with a gated shared expert and the expert
  // bias: the dense layers keep their MLP, the MoE layers count E experts, the router, its
  // bias, the shared expert and its gate; the FLOPs' MLP term by hand.
  ModelConfig mix = llama_shape(4, 64, 4, 0, 256, 32);
  mix.moe.num_experts = 4;
  mix.moe.moe_router_topk = 2;
  mix.moe.moe_ffn_hidden_size = 32;
  mix.moe.moe_layer_freq = 2;
  mix.moe.moe_shared_expert_intermediate_size = 48;
  mix.moe.moe_shared_expert_gate = true;
  mix.moe.moe_router_enable_expert_bias = true;
  mix.moe.moe_router_score_function = MoeScoreFunction::sigmoid;
  const double C = 64, attention = (4 + 8) * 16 * C + 4 * 16 * C + 2 * C, dense_mlp = 3 * 256 * C;
  const double moe_mlp = 4 * C + 4 + 4 * 3 * 32 * C + 3 * 48 * C + C;
  const double rest = 2 * 512 * C + C;
  CHECK(model::parameter_count(mix, 512) == 4 * attention + 2 * dense_mlp + 2 * moe_mlp + rest);
  CHECK(model::active_parameter_count(mix, 512) ==
        4 * attention + 2 * dense_mlp + 2 * (moe_mlp - 2 * 3 * 32 * C) + rest);
  ModelConfig flat = mix;  // the same FLOPs: a dense model whose average MLP width is the same
  flat.moe = {};
  flat.ffn_hidden_size = (256 * 2 + (32 * 2 + 48) * 2) / 4;
  CHECK(near(model::model_flops(mix, 512, 4), model::model_flops(flat, 512, 4)));
}
