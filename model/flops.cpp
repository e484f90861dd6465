#include "model/flops.hpp"

namespace mtnlg::model {

double parameter_count(const ModelConfig& m, int64_t V) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  return 12 * l * h * h * (1 + 13 / (12 * h) + (double(V) + s) / (12 * l * h));
}

double model_flops(const ModelConfig& m, int64_t V, int64_t B) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  return 72 * double(B) * l * s * h * h * (1 + s / (6 * h) + double(V) / (12 * h * l));
}

double hardware_flops(const ModelConfig& m, int64_t V, int64_t B, RecomputeGranularity rc) {
  const double l = double(m.num_layers), h = double(m.hidden_size), s = double(m.seq_length);
  switch (rc) {
    case RecomputeGranularity::full:
      return 96 * double(B) * s * l * h * h * (1 + s / (6 * h) + double(V) / (16 * l * h));
    case RecomputeGranularity::selective:
      return 72 * double(B) * l * s * h * h * (1 + s / (3 * h) + double(V) / (12 * h * l));
    case RecomputeGranularity::none:
      break;
  }
  return model_flops(m, V, B);
}

}  // namespace mtnlg::model
