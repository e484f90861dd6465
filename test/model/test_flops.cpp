// model/flops.hpp: the FLOP forms against a published run. MT-NLG 530B (105 layers, hidden
// 20480, seq 2048, vocabulary 51200 after padding for tp 8) at global batch 1920 ran 60.1 s
// per iteration on 2240 A100s at a reported 126 TFLOP/s per GPU, counted in the 96-form of
// full recompute (Narayanan et al. 2021 / Smith et al. 2022).
#include <catch2/catch.hpp>

#include <cmath>

#include "model/flops.hpp"

using namespace mtnlg;

TEST_CASE("model FLOPs: the forms reproduce MT-NLG 530B's published 126 TFLOP/s from 60.1 s", "[flops]") {
  ModelConfig m;
  m.num_layers = 105;
  m.hidden_size = 20480;
  m.num_attention_heads = 128;
  m.seq_length = 2048;
  const int64_t V = 51200;
  const auto within = [](double got, double want, double rel) { return std::fabs(got - want) <= rel * std::fabs(want); };
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
