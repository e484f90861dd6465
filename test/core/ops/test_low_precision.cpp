// bf16/fp16 storage on the CPU (core/ops/common.hpp, Widened): every op family with
// low-precision activations equals the f32 op on the same (already rounded) inputs,
// rounded to nearest even once at the store -- fp32 arithmetic, low-precision storage,
// the contract the CUDA kernels keep (checked per op by the op table,
// test/core/ops/test_op_table.cpp). Statistics and parameter gradients stay f32, and mixing
// the roles up is an error naming the tensor.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "core/half.hpp"
#include "core/ops.hpp"

using namespace mtnlg;

namespace {

// f32 tensor with values representable in `dt` (so both paths see the same inputs).
Tensor rounded_randn(const Shape& s, DType dt, std::mt19937_64& g, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::f32);
  std::normal_distribution<float> d(0.0f, static_cast<float>(scale));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  Tensor low = Tensor::empty(s, dt);
  ops::convert(low, t);
  ops::convert(t, low);
  return t;
}
Tensor to(const Tensor& t, DType dt) {
  Tensor o = Tensor::empty(t.shape(), dt);
  ops::convert(o, t);
  return o;
}
// The low-precision result must be exactly the f32 result rounded once.
void check_rounded_once(const Tensor& low, const Tensor& ref32) {
  REQUIRE(low.numel() == ref32.numel());
  Tensor expect = to(ref32, low.dtype());
  int64_t bad = 0;
  for (int64_t i = 0; i < low.numel(); ++i) bad += low.data<uint16_t>()[i] != expect.data<uint16_t>()[i];
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("half: conversions round to nearest even and keep inf/NaN", "[low_precision]") {
  using namespace half;
  CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even -> 1.
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 0.00390625f)) == 1.0f);
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 3 * 0.00390625f)) == 1.0f + 4 * 0.00390625f);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  CHECK(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
  CHECK(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f);
  CHECK(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));              // overflow: what fp16 loss scaling catches
  CHECK(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)) == 1.0f);        // tie -> even
  CHECK(f16_to_f32(f32_to_f16(5.9604645e-08f)) == 5.9604645e-08f);  // smallest subnormal
}

// Every op family's "bf16/f16 storage is the f32 op rounded once" comparison is a case of
// the op table (test/core/ops/op_cases.cpp, "ops table: <op> in bf16/f16 is the f32 op
// rounded once (CPU)", at the shapes this file used). Here: mixing the dtype roles up is
// an error naming the tensor, and AdamW's compute copy.
TEST_CASE("low precision: statistics and parameter gradients must be f32; AdamW writes the compute copy",
          "[low_precision]") {
  std::mt19937_64 g(7);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(to_string(dt));
    const int64_t N = 12, C = 16, OC = 24;
    Tensor x = rounded_randn({N, C}, dt, g), w = rounded_randn({OC, C}, dt, g, 0.2);
    SECTION("matmul: dw must be f32") {
      Tensor dout = rounded_randn({N, OC}, dt, g);
      Tensor dxl = Tensor::empty({N, C}, dt);
      Tensor wrong = Tensor::zeros({OC, C}, dt);
      CHECK_THROWS_WITH(ops::matmul_backward(&dxl, &wrong, nullptr, to(dout, dt), to(x, dt), to(w, dt)),
                        Catch::Contains("dw must be f32"));
    }
    SECTION("layernorm: mean must be f32") {
      Tensor lw = rounded_randn({C}, dt, g), lb = rounded_randn({C}, dt, g);
      Tensor yl = Tensor::empty({N, C}, dt), rl = Tensor::empty({N});
      Tensor bad_stats = Tensor::empty({N}, dt);
      CHECK_THROWS_WITH(ops::layernorm_forward(yl, bad_stats, rl, to(x, dt), to(lw, dt), to(lb, dt), 1e-5),
                        Catch::Contains("mean must be f32"));
    }
    SECTION("AdamW writes the compute copy of the f32 master") {
      const int64_t n = 37;
      Tensor p = rounded_randn({n}, DType::f32, g), gr = rounded_randn({n}, DType::f32, g);
      Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n}), copy = Tensor::empty({n}, dt);
      ops::adamw_step(p, gr, m, v, {1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 1.0}, &copy);
      check_rounded_once(copy, p);
    }
  }
}
