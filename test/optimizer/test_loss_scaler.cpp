// DynamicLossScaler state machine (optimizer/loss_scaler.hpp), against Megatron's rules:
// growth after `window` clean steps, back-off after `hysteresis` overflows, the
// hysteresis tracker refilled only by growth, min_scale floor, skipped-step count.
#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "optimizer/loss_scaler.hpp"

using namespace mtnlg;
using namespace mtnlg::optimizer;

namespace {
LossScalerConfig cfg(double init, int64_t window, int64_t hyst, double min_scale) {
  LossScalerConfig c;
  c.initial_scale = init;
  c.window = window;
  c.hysteresis = hyst;
  c.min_scale = min_scale;
  return c;
}
}  // namespace

TEST_CASE("loss scaler: starts at its initial scale", "[loss_scaler]") {
  DynamicLossScaler s(LossScalerConfig{});
  CHECK(s.scale() == 4294967296.0);
  CHECK(s.inv_scale() == 1.0 / 4294967296.0);
}

TEST_CASE("loss scaler: grows x2 after exactly `window` clean steps", "[loss_scaler]") {
  DynamicLossScaler s(cfg(1024, 3, 2, 1));
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 1024);
  CHECK(s.growth_tracker() == 2);
  CHECK(s.update(false));
  CHECK(s.scale() == 2048);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 4096);
  CHECK(s.skipped_steps() == 0);
}

TEST_CASE("loss scaler: hysteresis delays the back-off and is refilled only by growth", "[loss_scaler]") {
  DynamicLossScaler s(cfg(1024, 4, 2, 1));
  // First overflow: skipped, no back-off yet (hysteresis 2 -> 1).
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1024);
  CHECK(s.hysteresis_tracker() == 1);
  // Clean steps in between do NOT refill the hysteresis tracker (Megatron).
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.hysteresis_tracker() == 1);
  // Second overflow: tracker reaches 0 -> halve; growth tracker resets.
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 512);
  CHECK(s.growth_tracker() == 0);
  // Exhausted: every further overflow halves at once.
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 256);
  CHECK(s.skipped_steps() == 3);
  // Growth after a full window refills the tracker to `hysteresis`.
  for (int i = 0; i < 4; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 512);
  CHECK(s.hysteresis_tracker() == 2);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 512);  // tolerated once again
}

TEST_CASE("loss scaler: an overflow resets the growth window", "[loss_scaler]") {
  DynamicLossScaler s(cfg(8, 3, 1, 1));
  s.update(false);
  s.update(false);
  s.update(true);  // hysteresis 1: halves at once, and the window starts over
  CHECK(s.scale() == 4);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 4);
  s.update(false);
  CHECK(s.scale() == 8);
}

TEST_CASE("loss scaler: never goes below min_scale", "[loss_scaler]") {
  DynamicLossScaler s(cfg(4, 100, 1, 1));
  for (int i = 0; i < 10; ++i) CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1);
  CHECK(s.skipped_steps() == 10);
}

TEST_CASE("loss scaler: state round-trips and bad state or config is rejected", "[loss_scaler]") {
  DynamicLossScaler a(cfg(1024, 5, 3, 1));
  a.update(true);
  a.update(false);
  a.update(false);
  DynamicLossScaler b(cfg(1024, 5, 3, 1));
  b.load_state(a.state());
  for (bool o : {false, true, false, false, false, false, true, true, true}) CHECK(a.update(o) == b.update(o));
  CHECK(a.scale() == b.scale());
  CHECK(a.growth_tracker() == b.growth_tracker());
  CHECK(a.hysteresis_tracker() == b.hysteresis_tracker());
  CHECK(a.skipped_steps() == b.skipped_steps());

  DynamicLossScaler::State bad = a.state();
  bad.growth_tracker = 5;
  CHECK_THROWS_AS(b.load_state(bad), InputError);
  bad = a.state();
  bad.scale = 0.5;
  CHECK_THROWS_AS(b.load_state(bad), InputError);
  CHECK_THROWS_AS(DynamicLossScaler(cfg(0, 5, 2, 1)), InputError);
  CHECK_THROWS_AS(DynamicLossScaler(cfg(1024, 0, 2, 1)), InputError);
  CHECK_THROWS_AS(DynamicLossScaler(cfg(1024, 5, 0, 1)), InputError);
  CHECK_THROWS_AS(DynamicLossScaler(cfg(1024, 5, 2, 2048)), InputError);
}
