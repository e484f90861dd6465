// bf16/fp16 storage on the CPU (core/ops/common.hpp, Widened): every op family with
// low-precision activations equals the f32 op on the same (already rounded) inputs,
// rounded to nearest even once at the store -- fp32 arithmetic, low-precision storage,
// the contract the CUDA kernels keep. Statistics and parameter gradients stay f32, and
// mixing the roles up is an error naming the tensor.
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
void check_close(const Tensor& a, const Tensor& b, double tol) {
  REQUIRE(a.numel() == b.numel());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(double(a.data<float>()[i]) - b.data<float>()[i]) / (1.0 + std::fabs(b.data<float>()[i])));
  CHECK(worst <= tol);
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
  CHECK(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));  // overflow: what fp16 loss scaling catches
  CHECK(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)) == 1.0f);  // tie -> even
  CHECK(f16_to_f32(f32_to_f16(5.9604645e-08f)) == 5.9604645e-08f);  // smallest subnormal
}

TEST_CASE("low precision: each op equals the f32 op rounded once at the store", "[low_precision]") {
  std::mt19937_64 g(7);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(to_string(dt));
    const int64_t N = 12, C = 16, OC = 24;
    Tensor x = rounded_randn({N, C}, dt, g), w = rounded_randn({OC, C}, dt, g, 0.2), b = rounded_randn({OC}, dt, g);
    SECTION("matmul forward + backward (dw, dbias in f32)") {
      Tensor out32 = Tensor::empty({N, OC}), outl = Tensor::empty({N, OC}, dt);
      ops::matmul_forward(out32, x, w, &b);
      const Tensor bl = to(b, dt);
      ops::matmul_forward(outl, to(x, dt), to(w, dt), &bl);
      check_rounded_once(outl, out32);
      Tensor dout = rounded_randn({N, OC}, dt, g);
      Tensor dx32 = Tensor::empty({N, C}), dw32 = Tensor::zeros({OC, C}), db32 = Tensor::zeros({OC});
      Tensor dxl = Tensor::empty({N, C}, dt), dwl = Tensor::zeros({OC, C}), dbl = Tensor::zeros({OC});
      ops::matmul_backward(&dx32, &dw32, &db32, dout, x, w);
      ops::matmul_backward(&dxl, &dwl, &dbl, to(dout, dt), to(x, dt), to(w, dt));
      check_rounded_once(dxl, dx32);
      check_close(dwl, dw32, 0);  // same f32 kernel on the same values
      check_close(dbl, db32, 0);
      Tensor wrong = Tensor::zeros({OC, C}, dt);
      CHECK_THROWS_WITH(ops::matmul_backward(&dxl, &wrong, nullptr, to(dout, dt), to(x, dt), to(w, dt)),
                        Catch::Contains("dw must be f32"));
    }
    SECTION("layernorm: statistics and weight gradients f32") {
      Tensor lw = rounded_randn({C}, dt, g), lb = rounded_randn({C}, dt, g);
      Tensor y32 = Tensor::empty({N, C}), m32 = Tensor::empty({N}), r32 = Tensor::empty({N});
      Tensor yl = Tensor::empty({N, C}, dt), ml = Tensor::empty({N}), rl = Tensor::empty({N});
      ops::layernorm_forward(y32, m32, r32, x, lw, lb, 1e-5);
      ops::layernorm_forward(yl, ml, rl, to(x, dt), to(lw, dt), to(lb, dt), 1e-5);
      check_rounded_once(yl, y32);
      check_close(ml, m32, 0);
      Tensor dy = rounded_randn({N, C}, dt, g);
      Tensor dx32 = Tensor::empty({N, C}), dw32 = Tensor::zeros({C}), db32 = Tensor::zeros({C});
      Tensor dxl = Tensor::empty({N, C}, dt), dwl = Tensor::zeros({C}), dbl = Tensor::zeros({C});
      ops::layernorm_backward(dx32, dw32, db32, dy, x, lw, m32, r32);
      ops::layernorm_backward(dxl, dwl, dbl, to(dy, dt), to(x, dt), to(lw, dt), ml, rl);
      check_rounded_once(dxl, dx32);
      check_close(dwl, dw32, 0);
      Tensor bad_stats = Tensor::empty({N}, dt);
      CHECK_THROWS_WITH(ops::layernorm_forward(yl, bad_stats, rl, to(x, dt), to(lw, dt), to(lb, dt), 1e-5),
                        Catch::Contains("mean must be f32"));
    }
    SECTION("gelu, dropout, add, bias, position") {
      Tensor y32 = Tensor::empty({N, C}), yl = Tensor::empty({N, C}, dt);
      ops::gelu_forward(y32, x);
      ops::gelu_forward(yl, to(x, dt));
      check_rounded_once(yl, y32);
      ops::dropout_forward(y32, x, 0.25, 99, 1000);
      ops::dropout_forward(yl, to(x, dt), 0.25, 99, 1000);
      check_rounded_once(yl, y32);
      Tensor xl = to(x, dt);  // in place, as the model calls it
      ops::dropout_forward(xl, xl, 0.25, 99, 1000);
      check_rounded_once(xl, y32);
      Tensor a32 = Tensor::empty({N, C}), al = Tensor::empty({N, C}, dt);
      ops::add(a32, x, y32);
      ops::add(al, to(x, dt), to(y32, dt));
      check_rounded_once(al, [&] {
        Tensor r = Tensor::empty({N, C});
        ops::add(r, x, to(to(y32, dt), DType::f32));
        return r;
      }());
      Tensor bias = rounded_randn({C}, dt, g);
      Tensor x32 = x.clone(), xb = to(x, dt);
      ops::bias_add_forward(x32, bias);
      ops::bias_add_forward(xb, to(bias, dt));
      check_rounded_once(xb, x32);
      Tensor db32 = Tensor::zeros({C}), dbl = Tensor::zeros({C});
      ops::bias_add_backward(db32, x);
      ops::bias_add_backward(dbl, to(x, dt));
      check_close(dbl, db32, 0);
      Tensor pos = rounded_randn({8, C}, dt, g);
      Tensor p32 = x.clone(), pl = to(x, dt);
      ops::position_forward(p32, pos, 3, 4);
      ops::position_forward(pl, to(pos, dt), 3, 4);
      check_rounded_once(pl, p32);
      Tensor dp32 = Tensor::zeros({8, C}), dpl = Tensor::zeros({8, C});
      ops::position_backward(dp32, x, 3, 4);
      ops::position_backward(dpl, to(x, dt), 3, 4);
      check_close(dpl, dp32, 0);
    }
    SECTION("embedding and vocab-parallel cross-entropy") {
      const int64_t V = 20;
      Tensor table = rounded_randn({V, C}, dt, g);
      Tensor tok = Tensor::empty({N}, DType::i32);
      for (int64_t i = 0; i < N; ++i) tok.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % 26);  // some out of range
      Tensor e32 = Tensor::empty({N, C}), el = Tensor::empty({N, C}, dt);
      ops::embedding_forward(e32, tok, table, 3);
      ops::embedding_forward(el, tok, to(table, dt), 3);
      check_rounded_once(el, e32);
      Tensor dt32 = Tensor::zeros({V, C}), dtl = Tensor::zeros({V, C});
      ops::embedding_backward(dt32, tok, x, 3);
      ops::embedding_backward(dtl, tok, to(x, dt), 3);
      check_close(dtl, dt32, 0);
      Tensor logits = rounded_randn({N, V}, dt, g, 3.0);
      Tensor mx32 = Tensor::empty({N}), mxl = Tensor::empty({N}), se32 = Tensor::empty({N}), sel = Tensor::empty({N});
      Tensor tl32 = Tensor::empty({N}), tll = Tensor::empty({N});
      ops::xent_rowmax(mx32, logits, 17);
      ops::xent_rowmax(mxl, to(logits, dt), 17);
      check_close(mxl, mx32, 0);
      ops::xent_sumexp_target(se32, tl32, logits, tok, mx32, 2, 17);
      ops::xent_sumexp_target(sel, tll, to(logits, dt), tok, mxl, 2, 17);
      check_close(sel, se32, 0);
      check_close(tll, tl32, 0);
      Tensor dloss = Tensor::empty({N});
      ops::fill(dloss, 0.125);
      Tensor dl32 = Tensor::empty({N, V}), dll = to(logits, dt);  // in place over the logits, as the model does
      ops::xent_backward(dl32, logits, tok, mx32, se32, dloss, 2, 17);
      ops::xent_backward(dll, dll, tok, mxl, sel, dloss, 2, 17);
      check_rounded_once(dll, dl32);
    }
    SECTION("attention (lse form): out rounded once, lse f32") {
      const int64_t B = 2, T = 6, H = 2, D = 4;
      ops::AttentionDropout drop{0.2, 5, 0, 0, H};
      Tensor qkv = rounded_randn({B, T, 3 * H * D}, dt, g);
      Tensor o32 = Tensor::empty({B, T, H * D}), ol = Tensor::empty({B, T, H * D}, dt);
      Tensor l32 = Tensor::empty({B, H, T}), ll = Tensor::empty({B, H, T});
      ops::attention_forward_lse(o32, l32, qkv, H, drop);
      ops::attention_forward_lse(ol, ll, to(qkv, dt), H, drop);
      check_rounded_once(ol, o32);
      check_close(ll, l32, 0);
      Tensor dout = rounded_randn({B, T, H * D}, dt, g);
      Tensor d32 = Tensor::empty(qkv.shape()), dl = Tensor::empty(qkv.shape(), dt);
      ops::attention_backward_lse(d32, dout, qkv, o32, l32, H, drop);
      ops::attention_backward_lse(dl, to(dout, dt), to(qkv, dt), ol, ll, H, drop);
      check_rounded_once(dl, d32);
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
