// LR schedule, batch-size ramp and run length: edges of each phase, the MT-NLG and
// Megatron example numbers, and run_length against a brute-force simulation.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/error.hpp"
#include "schedules/batch_schedule.hpp"
#include "schedules/lr_schedule.hpp"

using namespace mtnlg;
using namespace mtnlg::schedules;
using Catch::Matchers::Contains;

namespace {
OptimizerConfig opt(LrDecayStyle s, int64_t warmup, int64_t decay) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.lr_decay_style = s;
  o.lr_warmup_tokens = warmup;
  o.lr_decay_tokens = decay;
  return o;
}
TrainingConfig ramp_cfg(int64_t start, int64_t incr, int64_t ramp_tokens, int64_t gbs) {
  TrainingConfig t;
  t.global_batch_size = gbs;
  t.rampup_batch_size = RampupBatchSize{start, incr, ramp_tokens};
  return t;
}
}  // namespace

TEST_CASE("lr: warmup edges", "[schedules][lr]") {
  for (auto s : {LrDecayStyle::cosine, LrDecayStyle::linear, LrDecayStyle::constant}) {
    auto o = opt(s, 100, 1100);
    CHECK(learning_rate(o, 0, 5000) == 0.0);
    CHECK(learning_rate(o, 1, 5000) == Approx(0.01));
    CHECK(learning_rate(o, 50, 5000) == Approx(0.5));
    CHECK(learning_rate(o, 100, 5000) == 1.0);  // end of warmup is exactly lr
  }
}

TEST_CASE("lr: cosine decay", "[schedules][lr]") {
  auto o = opt(LrDecayStyle::cosine, 100, 1100);
  CHECK(learning_rate(o, 101, 0) == Approx(1.0).epsilon(1e-5));
  CHECK(learning_rate(o, 600, 0) == Approx(0.55));  // half way: (1 + 0.1) / 2
  CHECK(learning_rate(o, 350, 0) == Approx(0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.25) + 1)));
  CHECK(learning_rate(o, 1100, 0) == Approx(0.1));
  CHECK(learning_rate(o, 1101, 0) == 0.1);
  CHECK(learning_rate(o, 1'000'000, 0) == 0.1);
}

TEST_CASE("lr: linear decay", "[schedules][lr]") {
  auto o = opt(LrDecayStyle::linear, 100, 1100);
  CHECK(learning_rate(o, 600, 0) == Approx(0.55));
  CHECK(learning_rate(o, 350, 0) == Approx(0.1 + 0.9 * 0.75));
  CHECK(learning_rate(o, 1100, 0) == Approx(0.1));
  CHECK(learning_rate(o, 5000, 0) == 0.1);
}

TEST_CASE("lr: constant style ignores min_lr after warmup", "[schedules][lr]") {
  auto o = opt(LrDecayStyle::constant, 100, 1100);
  CHECK(learning_rate(o, 600, 0) == 1.0);
  CHECK(learning_rate(o, 5000, 0) == 1.0);
}

TEST_CASE("lr: decay_tokens 0 means the whole run; no warmup", "[schedules][lr]") {
  auto o = opt(LrDecayStyle::linear, 0, 0);
  CHECK(learning_rate(o, 0, 1000) == 1.0);  // no warmup: full lr at step 0
  CHECK(learning_rate(o, 500, 1000) == Approx(0.55));
  CHECK(learning_rate(o, 1000, 1000) == Approx(0.1));
  CHECK(learning_rate(o, 1001, 1000) == 0.1);
  // decay <= warmup: min_lr right after warmup
  auto o2 = opt(LrDecayStyle::cosine, 100, 100);
  CHECK(learning_rate(o2, 100, 0) == 1.0);
  CHECK(learning_rate(o2, 101, 0) == 0.1);
}

TEST_CASE("lr: MT-NLG schedule", "[schedules][lr]") {
  OptimizerConfig o;
  o.lr = 5e-5;
  o.min_lr = 5e-6;
  o.lr_decay_style = LrDecayStyle::cosine;
  o.lr_warmup_tokens = 1'000'000'000;
  o.lr_decay_tokens = 340'000'000'000;
  CHECK(learning_rate(o, 500'000'000, 0) == Approx(2.5e-5));
  CHECK(learning_rate(o, 170'500'000'000, 0) == Approx(2.75e-5));
  CHECK(learning_rate(o, 400'000'000'000, 0) == 5e-6);
}

TEST_CASE("ramp: no ramp gives the global batch", "[schedules][ramp]") {
  TrainingConfig t;
  t.global_batch_size = 64;
  CHECK(global_batch_size(t, 128, 0) == 64);
  CHECK(global_batch_size(t, 128, 1'000'000) == 64);
}

TEST_CASE("ramp: MT-NLG numbers", "[schedules][ramp]") {
  auto t = ramp_cfg(32, 32, 12'000'000'000, 1920);
  const int64_t ramp = 12'000'000'000 / 2048;
  REQUIRE(ramp == 5'859'375);
  const double per_step = ramp / 59.0;  // ~99,311.4
  CHECK(per_step == Approx(99311.44).margin(0.01));
  CHECK(global_batch_size(t, 2048, 0) == 32);
  CHECK(global_batch_size(t, 2048, 99'311) == 32);
  CHECK(global_batch_size(t, 2048, 99'312) == 64);
  CHECK(global_batch_size(t, 2048, 198'622) == 64);
  CHECK(global_batch_size(t, 2048, 198'623) == 96);
  CHECK(global_batch_size(t, 2048, ramp - 1) == 1920 - 32);
  CHECK(global_batch_size(t, 2048, ramp) == 1920);
  CHECK(global_batch_size(t, 2048, ramp + 1) == 1920);
  // 59 increments: each batch size from 32 to 1888 occurs, then 1920.
  int64_t consumed = 0, last = 0, changes = 0;
  while (consumed <= ramp) {
    int64_t b = global_batch_size(t, 2048, consumed);
    CHECK(b >= last);
    if (b != last) ++changes, last = b;
    consumed += b;
  }
  CHECK(changes == 59);  // 32, 64, ..., 1888 during the ramp: 59 steps
  CHECK(last == 1888);
  CHECK(global_batch_size(t, 2048, consumed) == 1920);
}

TEST_CASE("ramp: Megatron example 16 8 300000 with GBS 1024", "[schedules][ramp]") {
  // ramp given in samples: 300000 samples at seq 1 token/sample.
  auto t = ramp_cfg(16, 8, 300'000, 1024);
  REQUIRE((1024 - 16) / 8 == 126);
  const double per_step = 300'000 / 126.0;  // ~2380.95
  CHECK(global_batch_size(t, 1, 0) == 16);
  CHECK(global_batch_size(t, 1, 2380) == 16);
  CHECK(global_batch_size(t, 1, 2381) == 24);
  CHECK(global_batch_size(t, 1, static_cast<int64_t>(per_step * 100) + 1) == 16 + 8 * 100);
  CHECK(global_batch_size(t, 1, 300'000) == 1024);
  CHECK(global_batch_size(t, 1, 300'001) == 1024);
  // seq_length scales the ramp: 300000 samples of 2048 tokens.
  auto t2 = ramp_cfg(16, 8, 300'000LL * 2048, 1024);
  CHECK(global_batch_size(t2, 2048, 2381) == 24);
}

TEST_CASE("ramp: shorter than one sequence is no ramp", "[schedules][ramp]") {
  auto t = ramp_cfg(8, 8, 100, 64);
  CHECK(global_batch_size(t, 128, 0) == 64);
  CHECK_THROWS_AS(global_batch_size(t, 0, 0), InputError);
}

namespace {
// Brute force: one iteration at a time, no closed form.
RunLength brute(const TrainingConfig& t, int64_t seq) {
  int64_t it = 0, consumed = 0;
  int64_t target = t.train_samples > 0 ? t.train_samples : (t.train_tokens + seq - 1) / seq;
  while (t.train_iters > 0 ? it < t.train_iters : consumed < target) {
    consumed += global_batch_size(t, seq, consumed);
    ++it;
  }
  return {it, consumed, consumed * seq};
}
}  // namespace

TEST_CASE("run_length: matches brute force", "[schedules][ramp]") {
  for (bool with_ramp : {false, true}) {
    for (int64_t seq : {1, 7, 16}) {
      for (int64_t n = 1; n <= 400; n += 13) {
        for (int kind = 0; kind < 3; ++kind) {
          TrainingConfig t = with_ramp ? ramp_cfg(4, 4, 300 * seq + seq / 2, 32) : TrainingConfig{};
          t.global_batch_size = 32;
          (kind == 0 ? t.train_iters : kind == 1 ? t.train_samples : t.train_tokens) = kind == 0 ? n : n * 11;
          auto a = run_length(t, seq);
          auto b = brute(t, seq);
          INFO("ramp " << with_ramp << " seq " << seq << " n " << n << " kind " << kind);
          CHECK(a.iterations == b.iterations);
          CHECK(a.samples == b.samples);
          CHECK(a.tokens == b.tokens);
          if (kind == 1) CHECK(a.samples >= t.train_samples);
          if (kind == 2) CHECK(a.tokens >= t.train_tokens);
        }
      }
    }
  }
}

TEST_CASE("run_length: MT-NLG-sized run", "[schedules][ramp]") {
  auto t = ramp_cfg(32, 32, 12'000'000'000, 1920);
  t.train_tokens = 270'000'000'000;
  auto a = run_length(t, 2048);
  auto b = brute(t, 2048);
  CHECK(a.iterations == b.iterations);
  CHECK(a.samples == b.samples);
  CHECK(a.tokens >= t.train_tokens);
  CHECK(a.tokens - t.train_tokens < 1920 * 2048);
}

TEST_CASE("run_length: errors", "[schedules][ramp]") {
  TrainingConfig t;
  t.global_batch_size = 8;
  CHECK_THROWS_WITH(run_length(t, 16), Contains("train_iters"));
  t.train_iters = 3;
  CHECK_THROWS_AS(run_length(t, 0), InputError);
  CHECK(run_length(t, 16).samples == 24);
}
