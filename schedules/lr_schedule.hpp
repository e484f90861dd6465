// Learning-rate schedule counted in consumed tokens (Megatron-DeepSpeed's
// --lr-warmup-tokens / --lr-decay-tokens rule). A pure function of the consumed
// token count so that a resumed run recomputes exactly the same LR.
#pragma once
#include <cstdint>

#include "config/training.hpp"

namespace mtnlg::schedules {

// lr at `consumed_tokens`:
//   warmup   consumed <= warmup_tokens (warmup_tokens > 0): lr * consumed / warmup_tokens
//                                      (0 at the first step, exactly lr at the end of warmup)
//   constant after warmup: lr forever (Megatron returns max_lr for the constant style;
//            min_lr is not used)
//   decay    warmup < consumed <= decay: ratio = (consumed - warmup) / (decay - warmup),
//            coeff = 1 - ratio (linear) or 0.5 * (cos(pi * ratio) + 1) (cosine),
//            lr = min_lr + coeff * (lr - min_lr)
//   after    consumed > decay: min_lr
// decay = o.lr_decay_tokens, or total_tokens when that is 0. When decay <= warmup
// the decay phase is empty and min_lr follows warmup directly.
double learning_rate(const OptimizerConfig& o, int64_t consumed_tokens, int64_t total_tokens);

}  // namespace mtnlg::schedules
