// DynamicLossScaler: see optimizer/loss_scaler.hpp for the rules.
#include "optimizer/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace mtnlg::optimizer {

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& cfg)
    : cfg_(cfg), scale_(cfg.initial_scale), hysteresis_tracker_(cfg.hysteresis) {
  if (!(cfg.initial_scale > 0) || !std::isfinite(cfg.initial_scale))
    throw_input("optimizer.initial_loss_scale must be a positive finite number, got {}", cfg.initial_scale);
  if (cfg.window < 1) throw_input("optimizer.loss_scale_window must be >= 1, got {}", cfg.window);
  if (cfg.hysteresis < 1) throw_input("optimizer.hysteresis must be >= 1, got {}", cfg.hysteresis);
  if (!(cfg.min_scale > 0) || cfg.min_scale > cfg.initial_scale)
    throw_input("optimizer.min_loss_scale must be in (0, initial_loss_scale = {}], got {}", cfg.initial_scale,
                cfg.min_scale);
  if (!(cfg.growth_factor > 1)) throw_input("loss scaler growth factor must be > 1, got {}", cfg.growth_factor);
  if (!(cfg.backoff_factor > 0 && cfg.backoff_factor < 1))
    throw_input("loss scaler backoff factor must be in (0, 1), got {}", cfg.backoff_factor);
}

bool DynamicLossScaler::update(bool found_overflow) {
  if (found_overflow) {
    ++skipped_;
    growth_tracker_ = 0;
    hysteresis_tracker_ -= 1;
    if (hysteresis_tracker_ <= 0) {
      hysteresis_tracker_ = 0;  // stays exhausted until the next growth (Megatron)
      scale_ = std::max(scale_ * cfg_.backoff_factor, cfg_.min_scale);
    }
    return false;
  }
  growth_tracker_ += 1;
  if (growth_tracker_ == cfg_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = cfg_.hysteresis;
    scale_ *= cfg_.growth_factor;
  }
  return true;
}

void DynamicLossScaler::load_state(const State& s) {
  if (!(s.scale >= cfg_.min_scale) || !std::isfinite(s.scale))
    throw_input("loss scaler state: scale {} is below min_loss_scale {} or not finite", s.scale, cfg_.min_scale);
  if (s.growth_tracker < 0 || s.growth_tracker >= cfg_.window)
    throw_input("loss scaler state: growth tracker {} outside [0, {})", s.growth_tracker, cfg_.window);
  if (s.hysteresis_tracker < 0 || s.hysteresis_tracker > cfg_.hysteresis)
    throw_input("loss scaler state: hysteresis tracker {} outside [0, {}]", s.hysteresis_tracker, cfg_.hysteresis);
  if (s.skipped_steps < 0) throw_input("loss scaler state: negative skipped-step count {}", s.skipped_steps);
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
  skipped_ = s.skipped_steps;
}

}  // namespace mtnlg::optimizer
