// Token-based warmup + decay learning-rate rule (see lr_schedule.hpp).
#include "schedules/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"

namespace mtnlg::schedules {

double learning_rate(const OptimizerConfig& o, int64_t consumed_tokens, int64_t total_tokens) {
  MTNLG_CHECK(consumed_tokens >= 0, "consumed_tokens {} is negative", consumed_tokens);
  const double max_lr = o.lr, min_lr = o.min_lr;
  const int64_t warmup = std::max<int64_t>(o.lr_warmup_tokens, 0);
  const int64_t decay = o.lr_decay_tokens > 0 ? o.lr_decay_tokens : total_tokens;

  if (warmup > 0 && consumed_tokens <= warmup)
    return max_lr * static_cast<double>(consumed_tokens) / static_cast<double>(warmup);
  if (o.lr_decay_style == LrDecayStyle::constant) return max_lr;
  if (consumed_tokens > decay || decay <= warmup) return min_lr;

  const double ratio = static_cast<double>(consumed_tokens - warmup) / static_cast<double>(decay - warmup);
  double coeff = 0.0;
  switch (o.lr_decay_style) {
    case LrDecayStyle::linear: coeff = 1.0 - ratio; break;
    case LrDecayStyle::cosine: coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0); break;
    case LrDecayStyle::constant: coeff = 1.0; break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace mtnlg::schedules
