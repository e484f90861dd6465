// app/process/module_configs: the recipe's optimizer section turned into the optimizer's
// own configs, defaults and set values alike.
#include <catch2/catch.hpp>

#include "app/process/module_configs.hpp"

using namespace mtnlg;

TEST_CASE("module configs: the optimizer's settings come from the recipe's optimizer section", "[configs]") {
  OptimizerConfig d;  // the recipe's defaults (Megatron's)
  const optimizer::LossScalerConfig ls = app::loss_scaler_config(d);
  CHECK(ls.initial_scale == 4294967296.0);
  CHECK(ls.window == 1000);
  CHECK(ls.hysteresis == 2);
  CHECK(ls.min_scale == 1.0);
  OptimizerConfig o;
  o.adam_beta1 = 0.8;
  o.adam_beta2 = 0.95;
  o.adam_eps = 1e-6;
  o.weight_decay = 0.1;
  o.clip_grad = 0.5;
  o.initial_loss_scale = 65536;
  o.loss_scale_window = 10;
  o.hysteresis = 3;
  o.min_loss_scale = 2;
  const optimizer::AdamWConfig a = app::adamw_config(o);
  CHECK(a.beta1 == 0.8);
  CHECK(a.beta2 == 0.95);
  CHECK(a.eps == 1e-6);
  CHECK(a.weight_decay == 0.1);
  CHECK(a.clip_grad == 0.5);
  const optimizer::LossScalerConfig l = app::loss_scaler_config(o);
  CHECK(l.initial_scale == 65536);
  CHECK(l.window == 10);
  CHECK(l.hysteresis == 3);
  CHECK(l.min_scale == 2);
}
