#include "model/flops.hpp"

#include <fmt/format.h>

namespace mtnlg::model {

namespace {

int64_t ffn_of(const ModelConfig& m) { return m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size; }
int64_t moe_layers(const ModelConfig& m) {
  int64_t n = 0;
  for (int64_t i = 0; i < m.num_layers; ++i) n += m.moe.is_moe_layer(i) ? 1 : 0;
  return n;
}
int64_t expert_ffn(const ModelConfig& m) {
  return m.moe.moe_ffn_hidden_size > 0 ? m.moe.moe_ffn_hidden_size : ffn_of(m);
}
// The MLP widths one token goes through, summed over the layers.
double mlp_width_sum(const ModelConfig& m) {
  const int64_t moe = moe_layers(m);
  const double routed = double(expert_ffn(m) * m.moe.moe_router_topk + m.moe.moe_shared_expert_intermediate_size);
  return double(ffn_of(m)) * double(m.num_layers - moe) + (moe > 0 ? routed * double(moe) : 0.0);
}

// Megatron-Core's count, per term, of one iteration of B sequences (12 = 3 GEMMs per
// forward GEMM x 2 FLOPs per multiply-add x 2 GEMMs of a kind per block).
struct CoreTerms {
  double scale;      // 12 B s l h^2
  double attn_proj;  // (1 + G/H) H D / h: q, k, v and the output projection
  double attn_core;  // (s/h) H D / h: Q K^T and P V, dense
  double mlp;        // (F/h) x 3/2 under SwiGLU
  double logit;      // V / (2 l h)
};
CoreTerms core_terms(const ModelConfig& m, int64_t V, int64_t B) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  const double H = double(m.num_attention_heads), G = double(m.query_groups()), D = double(m.head_dim());
  const double q_ratio = H * D / h;
  return {12 * double(B) * s * l * h * h, (1 + G / H) * q_ratio, s / h * q_ratio,
          mlp_width_sum(m) / (l * h) * (m.swiglu ? 1.5 : 1.0), double(V) / (2 * l * h)};
}

}  // namespace

bool gpt_flops_form(const ModelConfig& m) {
  return !m.moe.enabled() && !m.swiglu && m.query_groups() == m.num_attention_heads &&
         m.head_dim() * m.num_attention_heads == m.hidden_size && ffn_of(m) == 4 * m.hidden_size;
}

namespace {
// The exact count; `experts`: how many of an MoE layer's experts to count (E: all of them,
// k: those a token is routed to).
double count_parameters(const ModelConfig& m, int64_t V, int64_t experts) {
  const int64_t C = m.hidden_size, H = m.num_attention_heads, G = m.query_groups(), D = m.head_dim(), F = ffn_of(m);
  const int64_t norm = m.rmsnorm() ? C : 2 * C;
  const int64_t qkv = (H + 2 * G) * D, mats = m.swiglu ? 3 : 2;
  int64_t attention = qkv * C + H * D * C + 2 * norm;
  if (m.qkv_bias()) attention += qkv;
  if (m.qk_layernorm) attention += 2 * D;  // the query and key head norms' weights
  int64_t dense = mats * F * C;
  if (m.add_bias_linear) {  // the projection's bias; fc1's and fc2's
    attention += C;
    dense += (m.swiglu ? 2 : 1) * F + C;
  }
  const auto& e = m.moe;
  const int64_t E = e.num_experts, S = e.moe_shared_expert_intermediate_size;
  const int64_t moe = E * C + (e.moe_router_enable_expert_bias ? E : 0) + experts * mats * expert_ffn(m) * C +
                      (S > 0 ? mats * S * C + (e.moe_shared_expert_gate ? C : 0) : 0);
  const int64_t n_moe = moe_layers(m);
  int64_t rest = V * C + norm;
  if (!m.rope()) rest += (m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length) * C;
  if (m.untie_embeddings_and_output_weights) rest += V * C;
  return double(m.num_layers * attention + (m.num_layers - n_moe) * dense + n_moe * moe + rest);
}
}  // namespace

double parameter_count(const ModelConfig& m, int64_t V) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  if (gpt_flops_form(m) && !m.rope() && !m.rmsnorm() && !m.untie_embeddings_and_output_weights && m.add_bias_linear)
    return 12 * l * h * h * (1 + 13 / (12 * h) + (double(V) + s) / (12 * l * h));
  return count_parameters(m, V, m.moe.num_experts);
}

double active_parameter_count(const ModelConfig& m, int64_t V) {
  if (!m.moe.enabled()) return parameter_count(m, V);
  return count_parameters(m, V, m.moe.moe_router_topk);
}

double model_flops(const ModelConfig& m, int64_t V, int64_t B) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  if (gpt_flops_form(m)) return 72 * double(B) * l * s * h * h * (1 + s / (6 * h) + double(V) / (12 * h * l));
  const CoreTerms t = core_terms(m, V, B);
  return t.scale * (t.attn_proj + t.attn_core + t.mlp + t.logit);
}

double hardware_flops(const ModelConfig& m, int64_t V, int64_t B, RecomputeGranularity rc) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  if (gpt_flops_form(m)) {
    switch (rc) {
      case RecomputeGranularity::full:
        return 96 * double(B) * s * l * h * h * (1 + s / (6 * h) + double(V) / (16 * l * h));
      case RecomputeGranularity::selective:
        return 72 * double(B) * l * s * h * h * (1 + s / (3 * h) + double(V) / (12 * h * l));
      case RecomputeGranularity::none: break;
    }
    return model_flops(m, V, B);
  }
  const CoreTerms t = core_terms(m, V, B);
  const double layers = t.attn_proj + t.attn_core + t.mlp;
  switch (rc) {
    case RecomputeGranularity::full:  // the layers' forward (a third of forward + backward) again
      return t.scale * (layers * 4 / 3 + t.logit);
    case RecomputeGranularity::selective: return t.scale * (layers + t.attn_core + t.logit);
    case RecomputeGranularity::none: break;
  }
  return model_flops(m, V, B);
}

std::string model_flops_formula(const ModelConfig& m) {
  if (gpt_flops_form(m)) return "72*B*s*l*h^2*(1+s/(6h)+V/(12*l*h))";
  if (m.moe.enabled())
    return fmt::format(
        "12*B*s*l*h^2*((1+G/H+s/h)*H*D/h+{}(F*(l-l_moe)+(F_moe*k+F_shared)*l_moe)/(l*h)+V/(2*l*h)) with H {}, G {}, D "
        "{}, F {}, l_moe {}, F_moe {}, k {}, F_shared {}",
        m.swiglu ? "3/2*" : "", m.num_attention_heads, m.query_groups(), m.head_dim(), ffn_of(m), moe_layers(m),
        expert_ffn(m), m.moe.moe_router_topk, m.moe.moe_shared_expert_intermediate_size);
  return fmt::format("12*B*s*l*h^2*((1+G/H+s/h)*H*D/h+{}F/h+V/(2*l*h)) with H {}, G {}, D {}, F {}",
                     m.swiglu ? "3/2*" : "", m.num_attention_heads, m.query_groups(), m.head_dim(), ffn_of(m));
}

}  // namespace mtnlg::model
