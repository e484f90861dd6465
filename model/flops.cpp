#include "model/flops.hpp"

#include <fmt/format.h>

namespace mtnlg::model {

namespace {

int64_t ffn_of(const ModelConfig& m) { return m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size; }

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
          double(ffn_of(m)) / h * (m.swiglu ? 1.5 : 1.0), double(V) / (2 * l * h)};
}

}  // namespace

bool gpt_flops_form(const ModelConfig& m) {
  return !m.swiglu && m.query_groups() == m.num_attention_heads &&
         m.head_dim() * m.num_attention_heads == m.hidden_size && ffn_of(m) == 4 * m.hidden_size;
}

double parameter_count(const ModelConfig& m, int64_t V) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  if (gpt_flops_form(m) && !m.rope() && !m.rmsnorm() && !m.untie_embeddings_and_output_weights && m.add_bias_linear)
    return 12 * l * h * h * (1 + 13 / (12 * h) + (double(V) + s) / (12 * l * h));
  const int64_t C = m.hidden_size, H = m.num_attention_heads, G = m.query_groups(), D = m.head_dim(), F = ffn_of(m);
  const int64_t norm = m.rmsnorm() ? C : 2 * C;
  const int64_t qkv = (H + 2 * G) * D;
  int64_t layer = qkv * C + H * D * C + (m.swiglu ? 3 : 2) * F * C + 2 * norm;
  if (m.qkv_bias()) layer += qkv;
  if (m.qk_layernorm) layer += 2 * D;  // the query and key head norms' weights
  if (m.add_bias_linear) layer += C + (m.swiglu ? 2 : 1) * F + C;
  int64_t rest = V * C + norm;
  if (!m.rope()) rest += (m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length) * C;
  if (m.untie_embeddings_and_output_weights) rest += V * C;
  return double(m.num_layers * layer + rest);
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
  return fmt::format("12*B*s*l*h^2*((1+G/H+s/h)*H*D/h+{}F/h+V/(2*l*h)) with H {}, G {}, D {}, F {}",
                     m.swiglu ? "3/2*" : "", m.num_attention_heads, m.query_groups(), m.head_dim(), ffn_of(m));
}

}  // namespace mtnlg::model
