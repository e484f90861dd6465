// The test device (core/tensor.hpp): host memory the process treats as a device. Ops run
// their CPU kernels on it and give the CPU's bits; host code cannot read it; copies to
// and from it are counted as the host round trips and uploads they would be on a GPU;
// an op given tensors on two devices names both.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/ops.hpp"

using namespace mtnlg;

namespace {

Tensor host_ramp(const Shape& s, double scale) {
  Tensor t = Tensor::empty(s, DType::f32, Device::cpu);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(scale * ((i * 37) % 101 - 50) / 50.0);
  return t;
}

}  // namespace

TEST_CASE("test device: host reads of its memory are errors naming the tensor", "[unit]") {
  Tensor t = Tensor::empty({3, 4}, DType::bf16, Device::test);
  CHECK(t.device() == Device::test);
  CHECK(t.host_addressable());
  CHECK_THROWS_WITH(t.data<uint16_t>(), Catch::Contains("test tensor bf16 [3, 4] in device memory"));
  CHECK_NOTHROW(t.kernel_data<uint16_t>());  // what the CPU kernels use
  CHECK(to_string(Device::test) == "test");
}

TEST_CASE("test device: ops give the CPU's bits; copies are counted", "[unit]") {
  const Tensor x = host_ramp({8, 16}, 1.0), w = host_ramp({16}, 0.5), b = host_ramp({16}, 0.1);
  const int64_t reads = device_to_host_copies(), uploads = host_to_device_copies();
  const Tensor xd = x.to(Device::test), wd = w.to(Device::test), bd = b.to(Device::test);
  CHECK(host_to_device_copies() - uploads == 3);
  CHECK(device_to_host_copies() == reads);

  Tensor out = Tensor::empty({8, 16}, DType::f32, Device::cpu), mean = Tensor::empty({8}, DType::f32, Device::cpu),
         rstd = Tensor::empty({8}, DType::f32, Device::cpu);
  ops::layernorm_forward(out, mean, rstd, x, w, b, 1e-5);
  Tensor outd = Tensor::empty({8, 16}, DType::f32, Device::test), meand = Tensor::empty({8}, DType::f32, Device::test),
         rstdd = Tensor::empty({8}, DType::f32, Device::test);
  ops::layernorm_forward(outd, meand, rstdd, xd, wd, bd, 1e-5);
  const Tensor back = outd.to(Device::cpu);
  CHECK(device_to_host_copies() - reads == 1);
  for (int64_t i = 0; i < out.numel(); ++i) CHECK(back.data<float>()[i] == out.data<float>()[i]);

  // The step statistics stay on the device until one read.
  Tensor acc = Tensor::empty({1}, DType::f64, Device::test);
  ops::fill(acc, 0.0);
  ops::sum_squares_accumulate(acc, xd);
  ops::sum_squares_accumulate(acc, wd);
  CHECK(acc.to(Device::cpu).data<double>()[0] == ops::sum_squares(x) + ops::sum_squares(w));
}

TEST_CASE("test device: an op given tensors on two devices names both", "[unit]") {
  Tensor a = Tensor::empty({4}, DType::f32, Device::cpu), b = Tensor::empty({4}, DType::f32, Device::test);
  ops::fill(a, 1.0);
  ops::fill(b, 2.0);
  CHECK_THROWS_WITH(ops::add_inplace(a, b), Catch::Contains("different devices (cpu and test)"));
  Tensor c = Tensor::empty({4}, DType::f32, Device::cpu);
  c.copy_from(b);  // explicit copies cross devices
  CHECK(c.data<float>()[3] == 2.0f);
}

TEST_CASE("xent_loss_accumulate: the token losses' sum and count, with and without weights", "[unit]") {
  Tensor mx = host_ramp({5}, 1.0), se = host_ramp({5}, 0.3), tl = host_ramp({5}, 2.0), mask = host_ramp({5}, 1.0);
  for (int64_t i = 0; i < 5; ++i) {
    se.data<float>()[i] = 1.5f + static_cast<float>(i);  // sum of exp >= 1
    mask.data<float>()[i] = i % 2 ? 1.0f : 0.0f;
  }
  Tensor acc = Tensor::zeros({2}, DType::f64, Device::cpu);
  ops::xent_loss_accumulate(acc, mx, se, tl, nullptr);
  ops::xent_loss_accumulate(acc, mx, se, tl, &mask);
  double all = 0, masked = 0;
  for (int64_t i = 0; i < 5; ++i) {
    const double l = std::log(static_cast<double>(se.data<float>()[i])) + mx.data<float>()[i] - tl.data<float>()[i];
    all += l;
    masked += mask.data<float>()[i] * l;
  }
  CHECK(acc.data<double>()[0] == Approx(all + masked).epsilon(1e-14));
  CHECK(acc.data<double>()[1] == 7.0);
  Tensor bad = Tensor::zeros({2}, DType::f32, Device::cpu);
  CHECK_THROWS_WITH(ops::xent_loss_accumulate(bad, mx, se, tl, nullptr), Catch::Contains("acc must be f64"));
}

TEST_CASE("ops: shapes and dtype roles are checked once, before the dispatch, the same on every device", "[unit]") {
  for (Device dev : {Device::cpu, Device::test}) {
    INFO(to_string(dev));
    auto t = [&](const Shape& s, DType dt = DType::f32) {
      Tensor x = Tensor::empty(s, dt, dev);
      ops::fill(x, 0.5);
      return x;
    };
    Tensor out = t({4, 8}), inp = t({4, 8}), w = t({8}), b = t({8}), mean = t({3}), rstd = t({4});
    CHECK_THROWS_WITH(ops::layernorm_forward(out, mean, rstd, inp, w, b, 1e-5),
                      Catch::Contains("layernorm_forward: mean has 3"));
    Tensor w1 = t({8});
    CHECK_THROWS_WITH(ops::matmul_forward(out, inp, w1, nullptr),
                      Catch::Contains("matmul_forward: w must have 2 dimensions"));
    Tensor w0 = t({8, 0}), o0 = t({0});
    CHECK_THROWS_WITH(ops::matmul_forward(o0, inp, w0, nullptr),
                      Catch::Contains("matmul_forward: inp has 32"));  // no division by zero
    Tensor tok = t({4}), table = t({16, 8});
    CHECK_THROWS_WITH(ops::embedding_forward(out, tok, table, 0), Catch::Contains("tokens must be i32"));
    Tensor pos = t({16, 8});
    CHECK_THROWS_WITH(ops::position_forward(out, pos, 0, 0), Catch::Contains("outside the position table"));
    Tensor logits = t({4, 10}), rowmax = t({4}), sumexp = t({4}), tl = t({3}), targets = t({4}, DType::i32);
    CHECK_THROWS_WITH(ops::xent_sumexp_target(sumexp, tl, logits, targets, rowmax, 0, 10),
                      Catch::Contains("xent_sumexp_target: target_logit has 3"));
    // the Llama family's ops
    CHECK_THROWS_WITH(ops::rmsnorm_forward(out, mean, inp, w, 1e-5), Catch::Contains("rmsnorm_forward: rstd has 3"));
    Tensor dw = t({8}), rstd3 = t({3});
    CHECK_THROWS_WITH(ops::rmsnorm_backward(inp, dw, out, inp, w, rstd3),
                      Catch::Contains("rmsnorm_backward: rstd has 3"));
    Tensor odd = t({4, 7}), half = t({4, 3});
    CHECK_THROWS_WITH(ops::swiglu_forward(half, odd), Catch::Contains("swiglu_forward: inp width 7 is not 2 x F"));
    CHECK_THROWS_WITH(ops::swiglu_backward(inp, out, inp), Catch::Contains("swiglu_backward: dout has 32"));
    // qkv [B 1, T 2, G 2 x (H/G 2 + 2) x D 4 = 32]
    Tensor qkv = t({1, 2, 32}), qout = t({1, 2, 32});
    ops::RopeParams rp;
    rp.percent = 0.3;  // 1.2 dims of a head of 4
    CHECK_THROWS_WITH(ops::rope_forward(qout, qkv, 4, 2, rp, 0), Catch::Contains("not a positive even number of dims"));
    rp.percent = 0.28;
    CHECK(ops::rope_rot_dim(rp, 50) == 14);  // 50 x 0.28 is 14.000000000000002 in double
    rp.percent = 1.0;
    CHECK_THROWS_WITH(ops::rope_forward(qout, qkv, 3, 2, rp, 0),
                      Catch::Contains("rope_forward: heads 3 is not a positive multiple of the query groups 2"));
    rp.scaling = true;
    rp.high_freq_factor = 0.5;
    CHECK_THROWS_WITH(ops::rope_backward(qout, qkv, 4, 2, rp, 0), Catch::Contains("rope_backward: rope scaling needs"));
    // qk_norm: weights of the head size, rstd one per query and key head of a row
    Tensor w4 = t({4}), w5 = t({5}), r12 = t({12}), r8 = t({8});
    CHECK_THROWS_WITH(ops::qk_norm_forward(qout, r12, qkv, w4, w5, 4, 2, 1e-6),
                      Catch::Contains("qk_norm_forward: wk has 5 elements, expected 4"));
    CHECK_THROWS_WITH(ops::qk_norm_forward(qout, r8, qkv, w4, w4, 4, 2, 1e-6),
                      Catch::Contains("qk_norm_forward: rstd has 8 elements, expected 12"));
    Tensor buf = t({65}), from = buf.flat(0, 64).view({1, 2, 32}), shifted = buf.flat(1, 64).view({1, 2, 32});
    CHECK_THROWS_WITH(ops::qk_norm_forward(shifted, r12, from, w4, w4, 4, 2, 1e-6),
                      Catch::Contains("qk_norm_forward: the output overlaps the input without being it"));
    CHECK_THROWS_WITH(ops::qk_norm_backward(qout, w4, w4, qkv, qkv, w4, w4, r12, 3, 2),
                      Catch::Contains("qk_norm_backward: heads 3 is not a positive multiple of the query groups 2"));
    Tensor att = t({1, 2, 16}), lse = t({1, 4, 2});
    CHECK_THROWS_WITH(
        ops::attention_forward_lse(att, lse, qkv, 4, ops::AttentionDropout{}, 3),
        Catch::Contains("attention_forward_lse: heads 4 is not a positive multiple of the query groups 3"));
    Tensor kc = t({1, 4, 8, 4}), vc = t({1, 4, 8, 4});  // one per head, where the groups' are [1, 2, 8, 4]
    CHECK_THROWS_WITH(ops::attention_cached_forward(att, kc, vc, qkv, 4, 0, 2),
                      Catch::Contains("the caches must be [B, groups, capacity, D] = [1, 2, capacity, 4]"));
  }
}

TEST_CASE("Tensor::empty_pinned is ordinary host memory without a running CUDA backend", "[unit]") {
  Tensor src = Tensor::empty({5}, DType::f32, Device::test);
  ops::fill(src, 2.5);
  Tensor p = Tensor::empty_pinned({5}, DType::f32);
  CHECK(p.device() == Device::cpu);
  p.copy_from(src);  // what a checkpoint snapshot does from the device
  for (int64_t i = 0; i < 5; ++i) CHECK(p.data<float>()[i] == 2.5f);
}
